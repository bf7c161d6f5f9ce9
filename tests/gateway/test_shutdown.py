"""SIGTERM on ``switchyard serve``: the listener closes at once, streams already in flight run to
their end, the usage buffer is flushed to SQL, and the process exits with status 0."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import httpx

from gateway.db import migrate
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.serve_process import start_serve

STREAMS = 6


async def test_sigterm_finishes_streams_flushes_usage_and_exits_0(upstream: FakeUpstream, tmp_path: Path) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}"
    await asyncio.to_thread(migrate.upgrade, db_url)
    upstream.options.output_words, upstream.options.chunk_delay = 15, 0.1  # each stream takes ~1.5 s
    config = {
        "auth": {"admin_key": ADMIN_KEY},
        "database": {"url": db_url},
        "usage": {"journal_dir": str(tmp_path / "journal")},
        "models": [{"name": "echo", "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url, "api_key": "k"}]}],
    }  # fmt: skip
    proc, url, log = start_serve(config, tmp_path)
    try:
        started = asyncio.Event()
        first_chunks = 0

        async def one(client: httpx.AsyncClient) -> tuple[int, bytes]:
            nonlocal first_chunks
            body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                data = b""
                async for part in response.aiter_bytes():
                    if not data:
                        first_chunks += 1
                        if first_chunks == STREAMS:
                            started.set()
                    data += part
                return response.status_code, data

        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            streams = [asyncio.create_task(one(client)) for _ in range(STREAMS)]
            await asyncio.wait_for(started.wait(), 20)
            proc.send_signal(signal.SIGTERM)
            refused = False
            for _ in range(50):  # the listener closes right away: new connections are refused
                try:
                    httpx.get(url + "/healthz", timeout=0.5)
                except httpx.HTTPError:
                    refused = True
                    break
                await asyncio.sleep(0.05)
            results = await asyncio.gather(*streams)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert refused
    assert code == 0, log.read_text()[-3000:]
    for status, data in results:  # every in-flight stream ran to its end
        assert status == 200 and data.rstrip().endswith(b"data: [DONE]")
        assert data.count(b'"content"') >= 15
    with sqlite3.connect(tmp_path / "usage.db") as conn:
        rows = conn.execute("SELECT status, error_type, completion_tokens FROM usage_records").fetchall()
    assert len(rows) == STREAMS  # flushed on the way out, one row per request
    assert all(status == 200 and error is None and tokens >= 15 for status, error, tokens in rows)
    assert not list((tmp_path / "journal").glob("*")) or all(
        p.stat().st_size == 0 for p in (tmp_path / "journal").glob("*")
    )
