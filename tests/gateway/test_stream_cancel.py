"""A client that goes away mid-stream closes the upstream request, and the request is settled."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from backends.base import ChunkStream, Meter
from gateway.errors import ApiError
from gateway.streaming import Outcome, SSERelay
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault


def test_client_close_mid_stream_closes_upstream(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=2))  # two chunks, then stall until the gateway hangs up
    client = openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)
    stream = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c d"}],
                                            stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.content == "a "
    stream.close()
    record = upstream.streams[-1]
    assert record.wait(10), "the upstream stream was never closed"
    assert record.completed is False
    usage = env.usage.wait_for(1)[0]
    assert usage.extra == {"outcome": "client_disconnected"} and usage.status == 200
    assert usage.completion_tokens >= 1 and not usage.exact
    assert len(env.admission.settled) == 1


async def test_async_client_cancel_with_slow_upstream(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.options.chunk_delay = 0.2
    client = openai.AsyncOpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)
    words = " ".join(f"w{i}" for i in range(50))
    stream = await client.chat.completions.create(model="echo", messages=[{"role": "user", "content": words}],
                                                  stream=True, stream_options={"include_usage": True})
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    await stream.close()
    record = upstream.streams[-1]
    assert record.wait(10)
    assert record.completed is False
    assert env.usage.wait_for(1)[0].extra == {"outcome": "client_disconnected"}


async def test_a_relay_cancelled_while_it_finishes_still_reports_its_outcome() -> None:
    """SSERelay.finish runs in the response's task (no shielding task): cancelled while the
    upstream closes, it still settles the request before the cancellation goes on."""
    closing = asyncio.Event()

    class _Closing:
        def __aiter__(self) -> _Closing:
            return self

        async def __anext__(self) -> Any:
            raise StopAsyncIteration

        async def aclose(self) -> None:
            closing.set()
            await asyncio.Event().wait()  # an upstream that takes its time to close

    ended: list[tuple[Meter, Outcome, ApiError | None]] = []

    async def on_end(meter: Meter, outcome: Outcome, error: ApiError | None) -> None:
        ended.append((meter, outcome, error))

    stream = ChunkStream(chunks=_Closing(), meter=Meter(completion_tokens=3))
    relay = SSERelay(stream, "public", on_end)
    finishing = asyncio.ensure_future(relay.finish())
    await closing.wait()
    finishing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await finishing
    assert [(m.completion_tokens, o) for m, o, _ in ended] == [(3, Outcome.DISCONNECTED)]
    await relay.finish()  # idempotent: the background task's call reports nothing twice
    assert len(ended) == 1
