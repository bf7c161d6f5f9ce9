"""A config reload while requests are in flight: a stream on a deployment the reload removes or
reprices runs to its end and is metered at the price it started with; new requests take the new
config. The real app over a loopback upstream, reloaded through the admin API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_upstream import FakeUpstream
from tests.support.reload_gateway import reloadable_gateway
from tests.support.servers import ServerThread

WORDS = " ".join(f"w{i}" for i in range(20))
OLD, NEW = 1000.0, 1.0  # USD per million tokens, input and output


def _config(url: str, deployment: str, price: float) -> dict[str, Any]:
    dep = {"name": deployment, "provider": "openai", "model": "m", "api_base": url}
    return {"auth": {"admin_key": ADMIN_KEY}, "models": [{"name": "m", "deployments": [dep]}],
            "prices": {deployment: {"input_per_million": price, "output_per_million": price}}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerThread, Path, FakeUpstream, RecordingSink]]:
    upstream = FakeUpstream().start()
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(upstream.url, "old-dep", OLD)))
    usage = RecordingSink()
    try:
        with reloadable_gateway(path, usage) as server:
            yield server, path, upstream, usage
    finally:
        upstream.stop()


def _reload(server: ServerThread) -> None:
    r = httpx.post(server.url + "/admin/v1/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text


def test_a_stream_on_a_removed_deployment_is_priced_as_it_started(
        served: tuple[ServerThread, Path, FakeUpstream, RecordingSink]) -> None:
    server, path, upstream, usage = served
    upstream.options.chunk_delay = 0.03
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    stream = iter(client.chat.completions.create(model="m", messages=[{"role": "user", "content": WORDS}],
                                                  stream=True))
    first = next(stream)
    path.write_text(yaml.safe_dump(_config(upstream.url, "new-dep", NEW)))  # old-dep and its price are gone
    _reload(server)
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
    text = "".join(c.choices[0].delta.content or "" for c in [first, *stream] if c.choices)
    assert text == WORDS  # the stream ran to its end on the removed deployment
    rows = {r.deployment: r for r in usage.wait_for(2)}
    old, new = rows["old-dep"], rows["new-dep"]
    assert old.cost == pytest.approx((old.prompt_tokens + old.completion_tokens) * OLD / 1e6)
    assert new.cost == pytest.approx((new.prompt_tokens + new.completion_tokens) * NEW / 1e6)


def test_a_stream_is_priced_as_it_started_when_a_reload_reprices_its_deployment(
        served: tuple[ServerThread, Path, FakeUpstream, RecordingSink]) -> None:
    server, path, upstream, usage = served
    upstream.options.chunk_delay = 0.03
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    stream = iter(client.chat.completions.create(model="m", messages=[{"role": "user", "content": WORDS}],
                                                  stream=True))
    first = next(stream)
    path.write_text(yaml.safe_dump(_config(upstream.url, "old-dep", NEW)))  # the same deployment, cheaper
    _reload(server)
    assert len([first, *stream]) > 1
    [row] = usage.wait_for(1)
    assert row.cost == pytest.approx((row.prompt_tokens + row.completion_tokens) * OLD / 1e6)
