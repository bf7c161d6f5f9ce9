"""Signals to ``switchyard serve --workers 2`` with streams in flight: a SIGTERM to one worker drains
its streams to their end and the worker is replaced; a SIGKILLed worker's requests are settled once
(``incomplete``) by the worker that replaces it; SIGHUP lets the old workers finish their streams
while ``/readyz`` stays ready."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _rows, _tenant, _wait_rows, redis_server  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.long_streams import BODY, open_streams
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve, worker_pids

STREAMS = 4


async def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)


def _healthy(url: str) -> bool:
    """Whether the server answers its health check: a connection the kernel queued while the
    replacements still start (slow on a loaded host) may time out, which is "not yet", not a failure."""
    try:
        return httpx.get(url + "/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _busiest(pids: set[int], url: str) -> int:
    """The worker serving the most of the streams (connections to the gateway's port)."""
    port = int(url.rsplit(":", 1)[1])

    def streams(pid: int) -> int:
        return sum(c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
                   for c in psutil.Process(pid).net_connections("tcp"))

    return max(pids, key=streams)


def _finish(lines: list[str]) -> str:
    assert lines[-1] == "[DONE]", lines[-3:]
    return str(json.loads(lines[-2])["choices"][0]["finish_reason"])


async def _gateway(upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path, words: int,
                   drain: float, readiness: float = 0.0) -> tuple[Any, str, Path]:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = words, 0.1
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_seconds": drain, "drain_readiness_seconds": readiness}
    proc, url, log = start_serve(config, tmp_path, "--workers", "2")
    await _until(lambda: len(worker_pids(proc.pid)) == 2, 60)
    return proc, url, log


async def test_sigterm_to_one_worker_drains_its_streams_and_the_worker_is_replaced(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    proc, url, log = await _gateway(upstream, redis_server, tmp_path, words=40, drain=60)  # streams of ~4 s
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        first = worker_pids(proc.pid)
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
            streams = await open_streams(c, STREAMS)
            os.kill(_busiest(first, url), signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*streams), 60)
        await _until(lambda: len(worker_pids(proc.pid) - first) == 1 and len(worker_pids(proc.pid)) == 2, 60)
        assert proc.poll() is None
        assert all(_finish(lines) == "stop" for lines in results)
        rows = _wait_rows(tmp_path, tid, STREAMS)  # the other worker writes its rows when it flushes
        assert len(rows) == STREAMS and all(s == 200 and e is None for s, e, _ in rows), rows
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()[-3000:]


async def test_a_sigkilled_workers_streams_are_settled_once_by_its_replacement(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    proc, url, log = await _gateway(upstream, redis_server, tmp_path, words=600, drain=1)  # streams of ~60 s
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        first = worker_pids(proc.pid)
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=90) as c:
            streams = await open_streams(c, STREAMS)
            os.kill(_busiest(first, url), signal.SIGKILL)
            await _until(lambda: len(worker_pids(proc.pid) - first) >= 1, 60)
            # the replacement has started, which replays the dead worker's journal
            await _until(lambda: log.read_text(errors="replace").count("Application startup complete") >= 3, 60)
            proc.terminate()  # the streams on the other worker are drained (cut after 1 s)
            assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()[-3000:]
            results = await asyncio.wait_for(asyncio.gather(*streams), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = sum(lines[-1] == "cut" for lines in results)
    assert killed and all(_finish(lines) == "length" for lines in results if lines[-1] != "cut")
    rows = _rows(tmp_path, tid)
    assert len(rows) == STREAMS, rows  # one row a request: none lost, none twice
    assert sorted(str(e) for _, e, _ in rows) == ["drained"] * (STREAMS - killed) + ["incomplete"] * killed, rows


async def test_sighup_lets_the_old_workers_finish_their_streams_and_readyz_stays_ready(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """An old worker the restart replaced closes its listener at once and stays ready: with a
    readiness period (behind a load balancer) it used to go on taking connections, answering 503."""
    proc, url, log = await _gateway(upstream, redis_server, tmp_path, words=60, drain=60, readiness=3)  # streams ~6 s
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        first = worker_pids(proc.pid)
        readyz: list[int] = []
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
            streams = await open_streams(c, STREAMS)
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 120
            while worker_pids(proc.pid) & first or len(worker_pids(proc.pid)) < 2:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                async with httpx.AsyncClient(base_url=url, timeout=10) as fresh:  # a new connection each time
                    readyz.append((await fresh.get("/readyz")).status_code)
                await asyncio.sleep(0.1)
            results = await asyncio.wait_for(asyncio.gather(*streams), 60)
            after = await c.post("/v1/chat/completions", json=BODY | {"stream": False})
        assert readyz and set(readyz) == {200}, readyz
        assert all(_finish(lines) == "stop" for lines in results)
        assert after.status_code == 200
        rows = _wait_rows(tmp_path, tid, STREAMS + 1)
        assert len(rows) == STREAMS + 1 and all(s == 200 and e is None for s, e, _ in rows), rows
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()[-3000:]


async def test_workers_killed_as_soon_as_they_started_are_replaced(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """Workers that said their app started are replaced when they die, even before a health check
    saw them serving: such a death is no configuration that cannot start (it stopped the server)."""
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    proc, url, log = start_serve(_config(tmp_path, upstream, redis_server.url), tmp_path, "--workers", "2")
    try:
        await _until(lambda: log.read_text(errors="replace").count("Application startup complete") == 2, 60)
        first = worker_pids(proc.pid)
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        await _until(lambda: proc.poll() is not None or len(worker_pids(proc.pid) - first) == 2, 60)
        assert proc.poll() is None, log.read_text()[-2000:]
        await _until(lambda: _healthy(url), 60)
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()[-3000:]
