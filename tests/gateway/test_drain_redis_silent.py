"""SIGTERM while Redis answers nothing (paused) or is gone: the final settlements and slot
give-backs cost at most Redis's timeout, never the exit past the drain time; every stream still
leaves its usage row."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _rows, _tenant, redis_server  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.long_streams import open_streams
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve

STREAMS = 3


@pytest.mark.parametrize("outage", ["paused", "stopped"])
async def test_sigterm_with_redis_unreachable_exits_within_the_drain_time(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path, outage: str
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = 600, 0.1  # each stream would take 60 s
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_readiness_seconds": 0.0, "drain_seconds": 2.0}
    proc, url, log = start_serve(config, tmp_path)
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=90) as c:
            streams = await open_streams(c, STREAMS, 20)
            redis_server.pause() if outage == "paused" else redis_server.stop()
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*streams), 40)
            code = await asyncio.to_thread(proc.wait, 40)
            took = time.monotonic() - sent
    finally:
        if outage == "paused":
            redis_server.resume()
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert took < 2.0 + 5 + 3, (took, log.read_text()[-3000:])  # the drain, the settle time, Redis's timeout
    assert all(lines[-1] == "[DONE]" for lines in results)
    rows = _rows(tmp_path, tid)
    assert len(rows) == STREAMS and all(error == "drained" for _, error, _ in rows)
