"""An upstream stream pushed chunk by chunk from its connection's callbacks (``ChunkRelay.push``), and
read on by ``__anext__`` from wherever the push stopped: nothing lost, repeated or reordered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.base import Timeout, Unavailable, UpstreamError
from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import ChatCompletionRequest, ChatMessage, StreamOptions
from gateway.streaming import SSERelay
from tests.backends.test_openai_http import backend_for
from tests.support.fake_upstream import FakeUpstream, Fault

WORDS = [f"w{i} " for i in range(12)]


def chat(usage: bool = False) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="public", messages=[ChatMessage(role="user", content="".join(WORDS))],
                                 stream=True, stream_options=StreamOptions(include_usage=True) if usage else None)


def text(chunks: list[Any]) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


@pytest.fixture
async def backend(upstream: FakeUpstream):
    upstream.options.chunk_delay = 0.005  # each chunk in a read of its own
    b = backend_for(upstream.url)
    yield b
    await b.aclose()


async def test_push_hands_over_each_chunk_and_returns_at_the_end(backend: OpenAIHTTPBackend,
                                                                  upstream: FakeUpstream) -> None:
    stream = await backend.chat_stream(chat(usage=True))
    first = await anext(stream.chunks)
    pushed: list[Any] = []
    await stream.chunks.push(lambda chunk: pushed.append(chunk) or True)  # type: ignore[attr-defined]
    rest = [c async for c in stream]
    assert text([first, *pushed]) == WORDS and rest == []
    assert pushed[-1].usage.completion_tokens == len(WORDS)  # the usage chunk, as the client asked
    assert stream.meter.exact and stream.meter.completion_tokens == len(WORDS)
    assert upstream.streams[-1].wait(10) and upstream.streams[-1].completed
    assert backend.stats().in_flight == 0


async def test_a_push_the_sink_stops_goes_on_by_pulling(backend: OpenAIHTTPBackend) -> None:
    stream = await backend.chat_stream(chat())
    got = [await anext(stream.chunks)]
    for stop_at in (3, 6):  # push, stop, pull one, push again
        def sink(chunk: Any, stop_at: int = stop_at) -> bool:
            got.append(chunk)
            return len(got) < stop_at

        await stream.chunks.push(sink)  # type: ignore[attr-defined]
        assert len(got) == stop_at
        got.append(await anext(stream.chunks))
    got += [c async for c in stream]
    assert text(got) == WORDS
    assert stream.meter.completion_tokens == len(WORDS) and backend.stats().in_flight == 0


@pytest.mark.parametrize("pushed", [False, True])
async def test_a_stream_whose_body_ends_before_it_finished_fails(backend: OpenAIHTTPBackend, upstream: FakeUpstream,
                                                                 pushed: bool) -> None:
    """The body ends without [DONE] while the choice has no finish_reason: cut short (a proxy or the
    upstream dropped it), not completed, whether the chunks were pulled or pushed."""
    upstream.fail_next(Fault(end_after_chunks=3))
    stream = await backend.chat_stream(chat())
    got = [await anext(stream.chunks)]
    if pushed:
        await stream.chunks.push(lambda chunk: got.append(chunk) or True)  # type: ignore[attr-defined]
    with pytest.raises(Unavailable, match="ended the stream before it finished"):
        async for chunk in stream:
            got.append(chunk)
    assert len(got) == 3 and stream.meter.completion_tokens == 3  # what was relayed is metered
    assert backend.stats().in_flight == 0


async def test_a_stream_cut_while_another_choice_was_unfinished_fails(backend: OpenAIHTTPBackend,
                                                                      upstream: FakeUpstream) -> None:
    """n=2: choice 0 finished in the last chunk, choice 1 had not: still cut short."""
    upstream.fail_next(Fault(end_after_chunks=3, finish_last=True, alternate_choices=True))
    stream = await backend.chat_stream(chat())
    with pytest.raises(Unavailable, match="ended the stream before it finished"):
        async for _ in stream:
            pass


async def test_a_finished_stream_without_done_completes(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    """Every choice finished: an upstream that leaves out [DONE] is not a failure."""
    upstream.fail_next(Fault(end_after_chunks=3, finish_last=True))
    stream = await backend.chat_stream(chat())
    chunks = [c async for c in stream]
    assert len(chunks) == 3 and chunks[-1].choices[0].finish_reason == "stop"


async def test_a_failure_met_while_pushing_is_raised_by_the_next_read(backend: OpenAIHTTPBackend,
                                                                       upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(error_after_chunks=3))
    stream = await backend.chat_stream(chat())
    await anext(stream.chunks)
    pushed: list[Any] = []
    await stream.chunks.push(lambda chunk: pushed.append(chunk) or True)  # type: ignore[attr-defined]
    assert len(pushed) == 2
    with pytest.raises(UpstreamError, match="mid-stream"):
        await anext(stream.chunks)
    assert backend.stats().in_flight == 0  # the upstream response is closed


async def test_a_silence_while_pushing_times_out_as_it_does_when_pulling(upstream: FakeUpstream) -> None:
    backend = backend_for(upstream.url, idle=0.3)
    try:
        upstream.fail_next(Fault(hang_after_chunks=2))
        stream = await backend.chat_stream(chat())
        await anext(stream.chunks)
        pushed: list[Any] = []
        await asyncio.wait_for(stream.chunks.push(pushed.append), 5)  # type: ignore[attr-defined]
        with pytest.raises(Timeout, match="silent"):
            await anext(stream.chunks)
        assert len(pushed) == 1 and upstream.streams[-1].wait(10) and upstream.streams[-1].completed is False
    finally:
        await backend.aclose()


async def test_a_cancelled_push_leaves_a_stream_that_closes(backend: OpenAIHTTPBackend,
                                                             upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=3))
    stream = await backend.chat_stream(chat())
    await anext(stream.chunks)
    pushed: list[Any] = []
    push = asyncio.create_task(stream.chunks.push(lambda chunk: pushed.append(chunk) or True))  # type: ignore[attr-defined]
    while len(pushed) < 2:
        await asyncio.sleep(0.01)
    push.cancel()
    with pytest.raises(asyncio.CancelledError):
        await push
    await stream.aclose()
    assert upstream.streams[-1].wait(10) and upstream.streams[-1].completed is False
    assert backend.stats().in_flight == 0 and stream.meter.completion_tokens == 3


async def test_the_relay_writes_directly_and_sends_what_the_client_could_not_take_in_order(
        backend: OpenAIHTTPBackend) -> None:
    stream = await backend.chat_stream(chat())
    ends: list[str] = []

    async def on_end(meter: Any, outcome: Any, error: Any) -> None:
        ends.append(outcome.value)

    relay = SSERelay(stream, "public", on_end)
    out: list[tuple[str, bytes]] = []
    refused = {3, 7}  # the client's buffer is full for these writes: they go out through the ASGI send

    def write_now(data: bytes) -> bool:
        if len(out) in refused:
            refused.discard(len(out))
            return False
        out.append(("direct", data))
        return True

    relay.write_directly(write_now)
    async for data in relay:
        out.append(("sent", data))
    # The first chunk is sent; a refused one is sent next, and the one after it is pulled (then the
    # relay pushes again); the rest are written directly.
    ways = [way for way, _ in out]
    assert ways == ["sent", "direct", "direct", "sent", "sent", "direct", "direct", "sent", "sent",
                    *["direct"] * (len(out) - 10), "sent"], ways
    contents = [data for _, data in out[:-1]]
    assert all(b'"model":"public"' in data for data in contents)
    assert b'"role": "assistant"' in contents[0] and b'"finish_reason": "stop"' in contents[-1]
    words = zip(WORDS, contents[1:-1], strict=True)
    assert [f'"{word}"'.encode() in data for word, data in words] == [True] * len(WORDS)
    assert out[-1] == ("sent", b"data: [DONE]\n\n") and ends == ["completed"]
