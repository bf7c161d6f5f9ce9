"""``GET /readyz`` over real loopback upstreams: a model is ready when one of its own deployments is."""

from __future__ import annotations

import httpx

from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway

DEAD = "http://127.0.0.1:9/v1"  # nothing listens on the discard port


def test_unnamed_deployments_of_the_same_model_in_two_models_are_checked_apart() -> None:
    """Two models each served by an unnamed ``openai`` deployment of upstream model ``m`` (the same
    id, ``openai:m``) on different servers: the one whose server is down is not ready."""
    upstream = FakeUpstream().start()
    try:
        for order in ((DEAD, upstream.url), (upstream.url, DEAD)):
            models = [{"name": name, "deployments": [{"provider": "openai", "model": "m", "api_base": url,
                                                      "timeouts": {"connect": 0.5}}]}
                      for name, url in zip(("x", "y"), order, strict=True)]
            settings = parse_settings({"auth": {"admin_key": ADMIN_KEY}, "models": models}, env={})
            with scripted_gateway(settings) as server:
                body = httpx.get(server.url + "/readyz", timeout=10).json()
            up = order.index(upstream.url)
            assert body["models"] == {"x": up == 0, "y": up == 1}, body
            assert body["status"] == "not_ready"
    finally:
        upstream.stop()
