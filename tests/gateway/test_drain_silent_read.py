"""A stream relayed by reads (not pushed) whose upstream went silent before the drain began (a
chat stream after its first chunk; a background Responses stream before its last event): its read
races no drain time, so the drain interrupts it when its time ends, and the stream is cut then as a
flowing one is (a chat stream's last chunk with ``finish_reason: length`` and the usage, then
``[DONE]``; a Responses stream's ``response.incomplete``), settled as drained, its upstream closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest

from backends.base import ChunkStream, Meter
from backends.config import DeploymentConfig
from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import ChatCompletionRequest
from gateway import streaming
from gateway.dialects.responses import RelayedEvents
from gateway.drain import Drain
from gateway.errors import ApiError
from tests.support.fake_responses import FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream, Fault

CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi there"}]}'


@pytest.fixture
def native() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    yield server
    server.stop()


async def _cut_while_silent(stream: ChunkStream[Any], encoder: streaming.StreamEncoder | None,
                            monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[streaming.Outcome]]:
    """The events' data relayed from ``stream`` when the drain begins and ends (a second SIGTERM)
    while its read waits, and the outcomes reported."""
    drain = Drain()
    monkeypatch.setattr(streaming, "DRAIN", drain)
    outcomes: list[streaming.Outcome] = []

    async def on_end(meter: Meter, outcome: streaming.Outcome, error: ApiError | None) -> None:
        outcomes.append(outcome)

    events: AsyncIterator[bytes] = streaming.SSERelay(stream, "public", on_end, encoder).events()
    sent: list[bytes] = []
    while True:
        reading = asyncio.ensure_future(anext(events))
        done, _ = await asyncio.wait([reading], timeout=0.3)
        if not done:  # the upstream is silent: the read waits
            break
        sent.append(reading.result())
    drain.draining = True
    drain._end_now()
    sent += [await asyncio.wait_for(reading, 5)] + [event async for event in events]
    data = [line[6:] for event in sent for line in event.decode().split("\n") if line.startswith("data: ")]
    return [item if item == "[DONE]" else json.loads(item) for item in data], outcomes


async def test_a_chat_read_begun_before_the_drain_is_cut_when_the_drain_time_ends(
        upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream.fail_next(Fault(hang_after_chunks=1))  # one chunk, then silence until the gateway leaves
    backend = OpenAIHTTPBackend(DeploymentConfig(provider="openai", model="up", api_base=upstream.url, api_key="k"))
    try:
        stream = await backend.chat_stream(msgspec.json.decode(CHAT, type=ChatCompletionRequest))
        data, outcomes = await _cut_while_silent(stream, None, monkeypatch)
    finally:
        await backend.aclose()
    assert data[-1] == "[DONE]" and len(data) == 3
    assert data[-2]["choices"][0]["finish_reason"] == "length" and data[-2]["usage"]["completion_tokens"] > 0
    assert outcomes == [streaming.Outcome.DRAINED]
    assert upstream.streams[-1].wait() and upstream.streams[-1].completed is False  # the upstream saw it go


async def test_a_responses_read_begun_before_the_drain_is_cut_when_the_drain_time_ends(
        native: FakeResponsesUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = OpenAIHTTPBackend(DeploymentConfig(provider="openai", model="up", api_base=native.url, api_key="k",
                                                 responses_api=True))
    try:  # a background stream: every event but the last, then silence
        stream = await backend.respond_stream({"model": "m", "input": "hi there", "background": True, "stream": True})
        encoder = RelayedEvents(stream.meter, {}, {}, lambda response, output: None)
        data, outcomes = await _cut_while_silent(stream, encoder, monkeypatch)
    finally:
        await backend.aclose()
    types = [event["type"] for event in data]
    assert types[0] == "response.created" and "response.output_text.delta" in types
    assert types[-1] == "response.incomplete" and "response.completed" not in types
    assert outcomes == [streaming.Outcome.DRAINED]
