"""``GET /metrics`` of ``switchyard serve --workers 2``, as real processes: whichever worker answers,
a scrape shows the whole server's counters and histograms, and they never go back, across a rolling
restart (SIGHUP) too."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.shared_metrics import RETIRED
from tests.support.fake_upstream import FakeUpstream
from tests.support.serve_process import healthy, serving_workers, worker_pids

KEY = "sk-metrics-workers"
PUBLISHED_WITHIN = 5.0  # seconds: a worker publishes its figures every second


class Gateway:
    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc, self.url = proc, url
        self.seen: list[tuple[float, float]] = []  # every scrape's (requests, latency observations)

    def chat(self, n: int) -> None:
        """``n`` chat completions, each on a connection of its own, a few at a time: both workers answer."""

        def one(i: int) -> None:
            with openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0) as client:
                reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": f"m{i}"}])
                assert reply.choices[0].message.content == f"m{i}"

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(n)))

    def metrics_directory(self) -> Path:
        environ = Path(f"/proc/{min(worker_pids(self.proc.pid))}/environ").read_bytes().split(b"\0")
        return Path(next(v for v in environ if v.startswith(b"SWITCHYARD_METRICS_DIR=")).split(b"=", 1)[1].decode())

    def files_become(self, names: set[str]) -> None:
        """The metrics directory comes to hold just the live workers' files and ``names``."""
        directory, deadline = self.metrics_directory(), time.monotonic() + PUBLISHED_WITHIN
        want = lambda: {f"{pid}-" for pid in worker_pids(self.proc.pid)} | names  # noqa: E731
        have = lambda: {p.name if p.name in names else p.name.split("-")[0] + "-" for p in directory.iterdir()}  # noqa: E731
        while have() != want():
            assert time.monotonic() < deadline, (sorted(have()), sorted(want()))
            time.sleep(0.1)

    def scrape(self) -> tuple[float, float]:
        """(requests counted, latency observations) in one scrape on a new connection; each scrape
        shows at least what every earlier one showed."""
        with httpx.Client(timeout=5) as client:
            text = client.get(self.url + "/metrics").text
        samples = {(s.name, s.labels.get("status")): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples
                   if s.labels.get("model") == "echo"}
        figures = (samples.get(("switchyard_requests_total", "200"), 0.0),
                   samples.get(("switchyard_request_latency_seconds_count", None), 0.0))
        if self.seen:
            assert all(now >= before for now, before in zip(figures, self.seen[-1], strict=True)), (figures, self.seen)
        self.seen.append(figures)
        return figures

    def expect(self, total: int, scrapes: int = 12) -> None:
        """Once the workers published, every scrape shows ``total`` requests and observations."""
        deadline = time.monotonic() + PUBLISHED_WITHIN
        while self.scrape() != (total, total):
            assert time.monotonic() < deadline, f"scrapes show {self.seen[-5:]}, not {total}"
            time.sleep(0.1)
        for _ in range(scrapes):
            assert self.scrape() == (total, total), self.seen[-5:]


@pytest.fixture
def gateway(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Gateway]:
    config = {
        "auth": {"admin_key": KEY}, "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/gw.db"},
        "usage": {"journal_dir": str(tmp_path / "journal")},
        "models": [{"name": "echo", "deployments": [{"provider": "openai", "model": "e", "api_base": upstream.url}]}],
    }
    with serving_workers(config, tmp_path, 2) as (proc, url):
        yield Gateway(proc, url)


def test_every_scrape_shows_every_workers_requests_and_they_keep_counting_across_a_rolling_restart(
        gateway: Gateway) -> None:
    gateway.chat(20)
    gateway.expect(20)
    old = worker_pids(gateway.proc.pid)
    gateway.proc.send_signal(signal.SIGHUP)  # both workers are replaced, one after the other
    deadline = time.monotonic() + 90
    while len(worker_pids(gateway.proc.pid) - old) < 2 or len(worker_pids(gateway.proc.pid)) > 2:
        assert gateway.proc.poll() is None and time.monotonic() < deadline, "the workers were not replaced"
        try:
            gateway.scrape()  # during the restart too: never fewer
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    gateway.expect(20)  # the old workers' requests still count
    gateway.files_become({RETIRED})  # the old workers' files folded into one
    gateway.chat(10)
    gateway.expect(30)
    old = worker_pids(gateway.proc.pid)
    gateway.proc.send_signal(signal.SIGHUP)  # however often they are replaced: still one for the exited
    deadline = time.monotonic() + 90
    while len(worker_pids(gateway.proc.pid) - old) < 2 or len(worker_pids(gateway.proc.pid)) > 2:
        assert gateway.proc.poll() is None and time.monotonic() < deadline, "the workers were not replaced"
        time.sleep(0.05)
    gateway.expect(30)
    gateway.files_become({RETIRED})


def test_the_metrics_directory_is_the_servers_and_goes_with_it(gateway: Gateway) -> None:
    """One file per worker that served, in a directory the server removes as it stops."""
    directory = gateway.metrics_directory()
    gateway.chat(4)
    gateway.expect(4, scrapes=2)
    deadline = time.monotonic() + PUBLISHED_WITHIN
    while len(list(directory.glob("*.msgpack"))) < 2:
        assert time.monotonic() < deadline, list(directory.iterdir())
        time.sleep(0.1)
    assert len(list(directory.glob("*.msgpack"))) == 2
    gateway.proc.terminate()
    assert gateway.proc.wait(timeout=30) == 0
    assert not directory.exists()


def test_a_killed_workers_requests_still_count(gateway: Gateway) -> None:
    """A worker that dies without shutting down leaves its last published figures, which count on."""
    gateway.chat(12)
    gateway.expect(12)  # both workers published all they counted
    first = worker_pids(gateway.proc.pid)
    os.kill(min(first), signal.SIGKILL)
    deadline = time.monotonic() + 90
    while len(worker_pids(gateway.proc.pid) - first) < 1 or not healthy(gateway.url):
        assert gateway.proc.poll() is None and time.monotonic() < deadline, "the killed worker was not replaced"
        time.sleep(0.2)
    gateway.expect(12)
    gateway.files_become({RETIRED})
    gateway.chat(6)
    gateway.expect(18)
