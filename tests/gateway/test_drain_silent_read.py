"""A stream relayed by reads (not pushed) whose upstream went silent before the drain began (a
chat stream after its first chunk; a background Responses stream before its last event; the
built-in engine's stream while a step takes longer than the drain): its read races no drain time,
so the drain interrupts it when its time ends, and the stream is cut then as a flowing one is (a
chat stream's last chunk with ``finish_reason: length`` and the usage, then ``[DONE]``; a Responses
stream's ``response.incomplete``), settled as drained, its upstream closed (the engine's request
aborted, its KV blocks freed)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from backends.anthropic import AnthropicBackend
from backends.base import ChunkStream, Meter
from backends.config import DeploymentConfig
from backends.factory import build_backend
from backends.local import LocalEngineBackend
from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from backends.transformers_generate import HFGenerateBackend
from engine.tiny_model import build_tiny_model
from gateway import streaming
from gateway.dialects.responses import RelayedEvents
from gateway.drain import Drain
from gateway.errors import ApiError
from tests.support.fake_anthropic import SilentAnthropic
from tests.support.fake_responses import FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.fallback_models import build_model

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


async def _open(backend: Any, endpoint: str, asked: dict[str, Any], prompt: str | list[str]) -> ChunkStream[Any]:
    """A chat stream of "hi there" from ``backend``, or a completions stream of ``prompt``."""
    if endpoint == "chat":
        request = asked | {"messages": [{"role": "user", "content": "hi there"}]}
        return await backend.chat_stream(msgspec.json.decode(json.dumps(request), type=ChatCompletionRequest))
    request = asked | {"prompt": prompt}
    return await backend.complete_stream(msgspec.json.decode(json.dumps(request), type=CompletionRequest))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_an_anthropic_read_begun_before_the_drain_is_cut_when_the_drain_time_ends(
        endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    claude = SilentAnthropic().start()
    backend = AnthropicBackend(DeploymentConfig(provider="anthropic", model="claude-test", api_base=claude.url,
                                                api_key="k"))
    asked: dict[str, Any] = {"model": "m", "stream": True}
    try:
        stream = await _open(backend, endpoint, asked, "hi there")
        data, outcomes = await _cut_while_silent(stream, None, monkeypatch)
        left = await asyncio.to_thread(claude.wait_left, 1)
    finally:
        await backend.aclose()
        claude.stop()
    assert data[-1] == "[DONE]" and len(data) == 4  # the role, the text, the cut, [DONE]
    assert data[-2]["choices"][0]["finish_reason"] == "length"
    assert data[-2]["usage"]["prompt_tokens"] == 5 and data[-2]["usage"]["completion_tokens"] > 0
    assert outcomes == [streaming.Outcome.DRAINED]
    assert left  # the upstream saw it go


def _stalling(steps: int, aborts: Any, abort: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, threading.Event]:
    """``stall``, to call at each step of a model: past the first ``steps``, a step takes until
    ``aborts.<abort>`` is called (a model thinking longer than the drain: its streams say nothing
    meanwhile); and the event that ends the stall (set at the end, for a test that fails)."""
    released, done = threading.Event(), [0]
    aborting = getattr(aborts, abort)

    def stall(*_: Any) -> None:
        done[0] += 1
        if done[0] > steps:
            released.wait(30)

    def abort_and_release(*args: Any) -> None:
        released.set()
        aborting(*args)

    monkeypatch.setattr(aborts, abort, abort_and_release)
    return stall, released


def _silent_after_three_tokens(backend: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The built-in engine's steps (or plain transformers ``generate``'s forward passes) after the
    first three stall until a request is aborted."""
    if isinstance(backend, LocalEngineBackend):
        llm = backend.engine.engine
        stall, released = _stalling(3, backend.engine, "abort", monkeypatch)
        step = llm.step
        monkeypatch.setattr(llm, "step", lambda: (stall(), step())[1])
        return released
    assert isinstance(backend, HFGenerateBackend)
    stall, released = _stalling(3, backend.worker, "cancel", monkeypatch)
    backend.worker.model.register_forward_pre_hook(stall)
    return released


@pytest.mark.parametrize(("provider", "endpoint"), [("local", "chat"), ("local", "completions"),
                                                    ("transformers", "chat")])
async def test_an_engine_read_begun_before_the_drain_is_cut_when_the_drain_time_ends(
        provider: str, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in engine's chat stream, and its text completion stream of two prompts (each read
    by a task of its own); a chat stream of plain transformers ``generate`` (a ``local``
    deployment's model the engine cannot run)."""
    if provider == "local":
        folder = build_tiny_model(tmp_path / "tiny", seed=5, max_position_embeddings=2048)
        options: dict[str, Any] = {"num_kv_blocks": 192, "enable_prefix_caching": False}
    else:
        folder, options = build_model("gpt2", tmp_path / "gpt2"), {}
    backend: Any = build_backend(DeploymentConfig(provider=provider, model=str(folder), options=options))
    released = _silent_after_three_tokens(backend, monkeypatch)
    asked: dict[str, Any] = {"model": "tiny", "stream": True, "max_tokens": 200, "ignore_eos": True}
    try:
        stream = await _open(backend, endpoint, asked, ["hi there", "good morning"])
        data, outcomes = await _cut_while_silent(stream, None, monkeypatch)
    finally:
        released.set()
        await backend.aclose()
    assert data[-1] == "[DONE]" and len(data) > 3
    assert data[-2]["choices"][0]["finish_reason"] == "length"
    assert data[-2]["usage"]["completion_tokens"] >= 3 and data[-2]["usage"]["prompt_tokens"] > 0
    assert stream.meter.exact and stream.meter.completion_tokens == data[-2]["usage"]["completion_tokens"]
    assert outcomes == [streaming.Outcome.DRAINED]
    assert backend.stats().in_flight == 0  # the requests aborted (the engine's KV blocks freed)
    if provider == "local":
        assert backend.engine_metrics().kv_usage == 0.0
