"""``GET /metrics`` as a Prometheus server scrapes it: the answer's headers are ones its scraper takes."""

from __future__ import annotations

import httpx

from gateway.settings import parse_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway


def _media_type_parameters(header: str) -> list[str]:
    """The parameter names of a Content-Type, as Go's ``mime.ParseMediaType`` (Prometheus' scraper) reads them."""
    return [part.split("=", 1)[0].strip().lower() for part in header.split(";")[1:]]


def test_the_content_type_has_one_charset_so_prometheus_3_can_parse_it(fake_upstream_server: FakeUpstream) -> None:
    """A parameter named twice makes ``mime.ParseMediaType`` fail, and Prometheus 3 then fails the
    scrape (it has no ``fallback_scrape_protocol`` unless one is configured)."""
    echo = {"provider": "openai", "model": "m", "api_base": fake_upstream_server.url, "api_key": "sk-up"}
    settings = parse_settings({"models": [{"name": "echo", "deployments": [echo]}]}, env={})
    with scripted_gateway(settings) as server:
        answer = httpx.get(server.url + "/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    names = _media_type_parameters(answer.headers["content-type"])
    assert len(names) == len(set(names))
