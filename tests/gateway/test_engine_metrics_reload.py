"""A config reload that replaces a local engine (its options changed: a new engine under the same
deployment id) must not send its ``vllm:*`` counters and histograms back to zero: the replaced
engine's figures keep counting, as an exited worker's do with ``--workers N``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engine.tiny_model import build_tiny_model
from tests.conftest import ADMIN_KEY
from tests.support.reload_gateway import reloadable_gateway

COUNTED = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count")


def _config(folder: Path, blocks: int) -> dict[str, Any]:
    tiny = {"provider": "local", "model": str(folder), "name": "tiny-dep",
            "options": {"num_kv_blocks": blocks, "block_size": 16}}
    return {"auth": {"admin_key": ADMIN_KEY}, "models": [{"name": "tiny", "deployments": [tiny]}]}


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name in COUNTED and s.labels == {"model_name": "tiny-dep"}}


def test_engine_counters_count_on_across_a_reload_that_replaces_the_engine(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "tiny", seed=3, max_position_embeddings=256)
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(folder, 32)))
    with reloadable_gateway(path) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-user", max_retries=0)

        def chat() -> None:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=3, temperature=0)

        chat()
        before = _scrape(server.url)
        path.write_text(yaml.safe_dump(_config(folder, 48)))  # a new engine for the same deployment
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        assert httpx.post(server.url + "/admin/v1/reload", headers=admin, timeout=60).status_code == 200
        after_reload = _scrape(server.url)
        chat()
        after = _scrape(server.url)
    assert set(before) == set(COUNTED) and all(before[name] > 0 for name in COUNTED)
    assert after_reload == before
    assert after["vllm:e2e_request_latency_seconds_count"] == 2
    assert after["vllm:prompt_tokens_total"] == 2 * before["vllm:prompt_tokens_total"]  # the same prompt
