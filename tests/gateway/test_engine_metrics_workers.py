"""The local engines' ``vllm:*`` counters and histograms on ``GET /metrics`` of ``switchyard serve
--workers 2`` serving the tiny model, as real processes: each worker runs its own engine, and every
scrape shows the sum of both, never less than the scrape before."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.tiny_model import build_tiny_model
from gateway.telemetry.shared_metrics import Figures
from tests.gateway.test_metrics_workers import KEY, PUBLISHED_WITHIN
from tests.support.serve_process import serving_workers, worker_pids

GENERATED = "vllm:generation_tokens"


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc, self.url = proc, url
        self.seen: list[tuple[float, float]] = []  # every scrape's (tokens generated, e2e observations)

    def chat(self, n: int) -> int:
        """``n`` chat completions, each on a connection of its own, a few at a time (both workers
        answer); the completion tokens they reported."""

        def one(i: int) -> int:
            with openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0) as client:
                reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"m{i}"}],
                                                       max_tokens=6, temperature=0)
                assert reply.usage is not None
                return reply.usage.completion_tokens

        with ThreadPoolExecutor(4) as pool:
            return sum(pool.map(one, range(n)))

    def scrape(self) -> tuple[float, float]:
        """(tokens generated, requests finished) in one scrape on a new connection: never fewer than before."""
        with httpx.Client(timeout=5) as client:
            text = client.get(self.url + "/metrics").text
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if "model_name" in s.labels}  # the one deployment
        figures = (samples.get(GENERATED + "_total", 0.0), samples.get("vllm:e2e_request_latency_seconds_count", 0.0))
        if self.seen:
            assert all(now >= before for now, before in zip(figures, self.seen[-1], strict=True)), (figures, self.seen)
        self.seen.append(figures)
        return figures

    def expect(self, tokens: int, requests: int, scrapes: int = 12) -> None:
        deadline = time.monotonic() + PUBLISHED_WITHIN
        while self.scrape() != (tokens, requests):
            assert time.monotonic() < deadline, f"scrapes show {self.seen[-5:]}, not {(tokens, requests)}"
            time.sleep(0.1)
        for _ in range(scrapes):
            assert self.scrape() == (tokens, requests), self.seen[-5:]

    def published(self) -> list[float]:
        """Each worker's own tokens generated, as in its file in the server's metrics directory."""
        environ = Path(f"/proc/{min(worker_pids(self.proc.pid))}/environ").read_bytes().split(b"\0")
        variable = next(v for v in environ if v.startswith(b"SWITCHYARD_METRICS_DIR="))
        directory = Path(variable.split(b"=", 1)[1].decode())
        decoder = msgspec.msgpack.Decoder(Figures)
        return sorted(sum(c for c, _ in decoder.decode(p.read_bytes()).counters.get(GENERATED, {}).values())
                      for p in directory.glob("*.msgpack"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    folder = build_tiny_model(tmp_path / "tiny", seed=5, max_position_embeddings=2048)
    options = {"num_kv_blocks": 192, "block_size": 16, "enable_prefix_caching": False}
    config = {
        "auth": {"admin_key": KEY}, "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/gw.db"},
        "usage": {"journal_dir": str(tmp_path / "journal")},
        "models": [{"name": "tiny", "deployments": [{"provider": "local", "model": str(folder), "options": options}]}],
    }
    with serving_workers(config, tmp_path, 2) as (proc, url):
        yield Server(proc, url)


def test_every_scrape_shows_both_engines_tokens_summed_and_never_fewer(server: Server) -> None:
    tokens, requests = 0, 0
    for _ in range(8):  # the kernel hands each connection to a worker: on a busy host one may take many in a row
        tokens, requests = tokens + server.chat(8), requests + 8
        server.expect(tokens, requests, scrapes=2)
        mine = server.published()
        if len(mine) == 2 and all(mine):
            break
    assert len(mine) == 2 and all(mine), mine  # both workers' engines generated, and the scrapes sum them
    assert sum(mine) == tokens
    server.expect(tokens, requests)
    more = server.chat(8)
    server.expect(tokens + more, requests + 8)
