"""A client that goes away mid-stream closes the upstream request, and the request is settled."""

from __future__ import annotations

import openai

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
