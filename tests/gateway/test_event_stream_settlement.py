"""A relayed stream is settled (``SSERelay.finish``: the upstream closed, the request's outcome
reported) once, however its response ends: before the last byte when it completes, and also when
the server's ``send`` raises, before or in the middle of the body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.background_tasks import BackgroundTask

from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import ChatCompletionRequest, ChatMessage
from gateway.event_stream import DIRECT_SEND, EventStream
from gateway.streaming import SSERelay
from tests.backends.test_openai_http import backend_for
from tests.support.fake_upstream import FakeUpstream


@pytest.fixture
async def backend(upstream: FakeUpstream) -> AsyncIterator[OpenAIHTTPBackend]:
    upstream.options.chunk_delay = 0.005  # each chunk in a read of its own
    b = backend_for(upstream.url)
    yield b
    await b.aclose()


class Broken(OSError):
    """What a server's ``send`` may raise when the connection under it breaks."""


async def respond(backend: OpenAIHTTPBackend, fail_at: int | None, sent: list[dict[str, Any]],
                  settled: list[tuple[str, int]]) -> None:
    """Relay a streamed chat through ``EventStream`` as the pipeline does, into ``sent``; the
    server's ``send`` raises at its ``fail_at``-th message (0: the response's start). Each
    settlement goes in ``settled``, with how many messages had gone out before it."""
    stream = await backend.chat_stream(ChatCompletionRequest(
        model="public", messages=[ChatMessage(role="user", content="one two three four five six")], stream=True))
    ended = asyncio.Event()

    async def on_end(meter: Any, outcome: Any, error: Any) -> None:
        settled.append((outcome.value, len(sent)))

    async def send(message: Any) -> None:
        if len(sent) == fail_at:
            ended.set()
            raise Broken("connection reset")
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            ended.set()

    async def receive() -> Any:  # as a server's: the disconnect comes once the response is over
        await ended.wait()
        return {"type": "http.disconnect"}

    relay = SSERelay(stream, "public", on_end)
    response = EventStream(relay, background=BackgroundTask(relay.finish)).to_asgi_response(None, None)  # type: ignore[arg-type]
    await response({"type": "http", DIRECT_SEND: send}, receive, send)  # type: ignore[arg-type]


async def test_a_completed_stream_is_settled_once_before_its_last_byte(backend: OpenAIHTTPBackend) -> None:
    sent: list[dict[str, Any]] = []
    settled: list[tuple[str, int]] = []
    await respond(backend, None, sent, settled)
    assert [m.get("body") for m in sent[-2:]] == [b"data: [DONE]\n\n", b""]
    assert settled == [("completed", len(sent) - 2)]  # before [DONE]; not again after the end
    assert backend.stats().in_flight == 0


@pytest.mark.parametrize("fail_at", [0, 3], ids=["at the start", "mid-stream"])
async def test_a_send_that_raises_still_settles_the_stream_once(backend: OpenAIHTTPBackend, upstream: FakeUpstream,
                                                                fail_at: int) -> None:
    sent: list[dict[str, Any]] = []
    settled: list[tuple[str, int]] = []
    with pytest.raises(Broken):  # the server hears of its own failure
        await respond(backend, fail_at, sent, settled)
    assert len(sent) == fail_at
    assert settled == [("client_disconnected", fail_at)]  # was []: never settled, the upstream left open
    assert upstream.streams[-1].wait(10) and upstream.streams[-1].completed is False
    assert backend.stats().in_flight == 0
