"""SIGTERM on ``switchyard serve`` while streams from an ``anthropic`` deployment wait on an upstream
gone silent (a model thinking): each is cut when the drain time ends, as one from an
OpenAI-compatible upstream is, not left for uvicorn's shutdown to drop without its last events. A
chat stream ends with a last chunk carrying ``finish_reason: length`` and the usage, then
``[DONE]``; a /v1/messages one with ``stop_reason: max_tokens`` and ``message_stop``; each is
settled as drained (a usage row), its upstream stream closed."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import anthropic
import openai

from gateway.db import migrate
from tests.gateway.test_crash_recovery import _config, _rows, _tenant, redis_server  # noqa: F401
from tests.support.fake_anthropic import SilentAnthropic
from tests.support.fake_upstream import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.serve_process import start_serve


async def test_streams_from_a_silent_anthropic_upstream_are_cut_when_the_drain_time_ends(
    upstream: FakeUpstream, redis_server: RedisProcess, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    claude = SilentAnthropic().start()
    config = _config(tmp_path, upstream, redis_server.url)
    config["models"] = [{"name": "claude", "max_retries": 0, "deployments": [
        {"provider": "anthropic", "model": "claude-test", "api_base": claude.url, "api_key": "sk-ant"}]}]
    config["server"] = {"drain_readiness_seconds": 0.5, "drain_seconds": 1.0}  # uvicorn cancels 6 s after 0.5 s
    proc, url, log = start_serve(config, tmp_path)
    try:
        tid, key = _tenant(url, max_concurrency=10, token_budget=1_000_000, budget_period="total")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as oai, \
                anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=30) as ant:
            chat = await oai.chat.completions.create(model="claude", stream=True,
                                                     messages=[{"role": "user", "content": "hi there"}])
            chunks = [await anext(chat), await anext(chat)]  # the role, then the first text
            messages = await ant.messages.create(model="claude", max_tokens=100, stream=True,
                                                 messages=[{"role": "user", "content": "hi there"}])
            events = [await anext(messages) for _ in range(3)]  # message_start, the text block's start and text
            proc.send_signal(signal.SIGTERM)
            # the SDKs raise on a body cut before its last events
            chunks += [chunk async for chunk in chat]
            events += [event async for event in messages]
        code = await asyncio.to_thread(proc.wait, 30)
        left = await asyncio.to_thread(claude.wait_left, 2)
    finally:
        if proc.poll() is None:
            proc.kill()
        claude.stop()
    assert code == 0, log.read_text()[-3000:]
    assert chunks[1].choices[0].delta.content == "Let me think"
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.usage is not None
    assert last.usage.prompt_tokens == 5 and last.usage.completion_tokens > 0
    kinds = [event.type for event in events]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2].delta.stop_reason == "max_tokens"
    assert left  # the upstream saw both streams go
    rows = _rows(tmp_path, tid)
    assert [(status, error) for status, error, _ in rows] == [(200, "drained")] * 2
