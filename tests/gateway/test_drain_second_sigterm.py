"""A second SIGTERM while ``switchyard serve`` drains stops it at once (README: "A second SIGTERM
stops at once"), or a SIGINT (Ctrl-C) then, with one worker or several (the supervisor passes it on): the streams still
running are cut then, each with its last chunk and settled, rather than after the drain time."""

from __future__ import annotations

import asyncio
import json
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


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("workers", [1, 2])
async def test_a_second_sigterm_cuts_the_streams_and_exits_at_once(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path, workers: int, second: signal.Signals
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = 600, 0.1  # each stream would take 60 s
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_readiness_seconds": 30.0, "drain_seconds": 60.0}
    proc, url, log = start_serve(config, tmp_path, "--workers", str(workers))
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=90) as c:
            streams = await open_streams(c, STREAMS, 20)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1)
            assert (await c.get("/readyz")).status_code == 503
            sent = time.monotonic()
            proc.send_signal(second)
            results = await asyncio.wait_for(asyncio.gather(*streams), 20)
            code = await asyncio.to_thread(proc.wait, 20)
            took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert took < 10, took
    for lines in results:
        assert lines[-1] == "[DONE]" and json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
    rows = _rows(tmp_path, tid)
    assert len(rows) == STREAMS and all(status == 200 and error == "drained" for status, error, _ in rows)
