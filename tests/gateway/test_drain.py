"""SIGTERM on ``switchyard serve`` with streams longer than the drain time: readiness fails first,
then the streams still running when the drain time is over are ended cleanly (a last chunk with
``finish_reason: length`` and the usage, then ``[DONE]``), each settled (a usage row for what was
produced, its concurrency slot released, the budget equal to the rows) before the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx
import openai
from redis import Redis

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _rows, _tenant, redis_server  # noqa: F401
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve

STREAMS = 4


async def test_sigterm_fails_readiness_then_ends_long_streams_cleanly_and_settles_them(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.options.output_words, upstream.options.chunk_delay = 300, 0.1  # each stream would take 30 s
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_readiness_seconds": 1.0, "drain_seconds": 1.5}
    proc, url, log = start_serve(config, tmp_path)
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        started = asyncio.Event()
        firsts = 0

        async def one(client: httpx.AsyncClient) -> tuple[int, list[str]]:
            nonlocal firsts
            body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines: list[str] = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        firsts += not lines
                        lines.append(line[6:])
                        if firsts == STREAMS:
                            started.set()
                return response.status_code, lines

        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
            streams = [asyncio.create_task(one(c)) for _ in range(STREAMS)]
            await asyncio.wait_for(started.wait(), 20)
            proc.send_signal(signal.SIGTERM)
            ready = await c.get("/readyz")  # still listening, no longer ready
            results = await asyncio.gather(*streams)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ready.status_code == 503 and ready.json()["dependencies"]["accepting_requests"] is False
    assert code == 0, log.read_text()[-3000:]
    produced = []
    for status, lines in results:
        assert status == 200 and lines[-1] == "[DONE]"
        last = json.loads(lines[-2])
        assert last["choices"][0]["finish_reason"] == "length"
        assert 0 < last["usage"]["completion_tokens"] < 300
        produced.append(last["usage"]["completion_tokens"])
    rows = _rows(tmp_path, tid)
    assert len(rows) == STREAMS and all(status == 200 and error == "drained" for status, error, _ in rows)
    with Redis.from_url(redis_server.url) as r:
        assert r.zcard(f"sy:q:tenant:{tid}:cc") == 0  # every slot released
        assert int(r.hget(f"sy:q:tenant:{tid}:bd:total", "tokens") or 0) == sum(t for _, _, t in rows)


async def test_a_stream_silent_when_the_drain_time_ends_is_cut_then_too(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """A stream whose upstream says nothing more after its first chunk (a model thinking) is cut when
    the drain time ends, as a flowing one is, not left for uvicorn to drop with the process's exit."""
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    upstream.fail_next(Fault(hang_after_chunks=1))  # one chunk, then silence until the gateway leaves
    config = _config(tmp_path, upstream, redis_server.url)
    config["server"] = {"drain_readiness_seconds": 0.5, "drain_seconds": 1.0}  # uvicorn cancels 6 s after 0.5 s
    proc, url, log = start_serve(config, tmp_path)
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as client:
            stream = await client.chat.completions.create(
                model="echo", stream=True, messages=[{"role": "user", "content": "hi there"}])
            chunks = [await anext(stream)]
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            chunks += [chunk async for chunk in stream]  # the SDK raises on a body cut before [DONE]
            took = time.monotonic() - sent
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert took < 4.5, took  # at the drain time's end (1.5 s), not at uvicorn's cancel (6.5 s)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.usage is not None
    assert last.usage.completion_tokens > 0 and upstream.streams[-1].wait() and not upstream.streams[-1].completed
    rows = _rows(tmp_path, tid)
    assert [(status, error) for status, error, _ in rows] == [(200, "drained")]
