"""A SIGTERM to ``switchyard serve --workers 2`` during a rolling restart (SIGHUP) stops the restart
and drains every worker at once, old and new, instead of waiting behind the restart (a new worker's
start-up, then each old worker's whole drain): an orchestrator's stop timeout would SIGKILL it all."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _rows, _tenant, redis_server  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.long_streams import open_streams
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve

STREAMS = 4
DRAIN = 20.0


async def _wait_for_line(log: Path, text: str, timeout: float, count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        await asyncio.sleep(0.1)


async def test_sigterm_during_a_rolling_restart_drains_every_worker_at_once(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = 600, 0.1  # each stream would take 60 s
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_seconds": DRAIN}
    proc, url, log = start_serve(config, tmp_path, "--workers", "2")
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=120) as c:
            streams = await open_streams(c, STREAMS, 30)
            proc.send_signal(signal.SIGHUP)
            await _wait_for_line(log, "retired by a rolling restart", 90)  # the first old worker drains
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # the other old worker and the new one drain too, now, not after the first one's drain
            await _wait_for_line(log, "SIGTERM: not ready from now", 5, count=2)
            code = await asyncio.to_thread(proc.wait, 120)
            took = time.monotonic() - sent
            results = await asyncio.wait_for(asyncio.gather(*streams), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    # every worker drained together: one drain time, not the restart's start-ups and drains in a row
    assert took < DRAIN + 10, (took, log.read_text()[-3000:])
    for lines in results:
        assert lines[-1] == "[DONE]" and json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
    rows = _rows(tmp_path, tid)
    assert len(rows) == STREAMS and all(status == 200 and error == "drained" for status, error, _ in rows), rows
