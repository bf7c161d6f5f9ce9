"""A fake OpenAI-compatible upstream with fault injection and a record of what it received.

Built on the echo upstream (``backends.dev.echo_server``): answers echo the prompt. Tests (and
benchmarks) shape it with ``options`` (latency, chunk delay, output length, usage reporting) and queue one-shot
``Fault``s (an error; a stream that fails, stalls, or goes silent for a while part way); every request
is recorded in ``received`` and every stream in ``streams`` (whether it
ran to the end or the client went away), and the most requests it held at once in ``peak_in_flight``.
``answer_headers`` go in the head of every answer (as OpenAI's rate-limit headers do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from backends.dev.echo_server import EchoOptions, EchoUpstream, Exchange, error_body, send_json
from tests.support.servers import OnLoopback


@dataclass
class Fault:
    """What to do instead of (or to) the next answer."""

    status: int | None = None  # answer with this status and ``body``
    body: Any = None  # JSON body (default: an OpenAI-shaped error) or raw bytes, or a function of the request's headers
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before the response headers
    error_after_chunks: int | None = None  # stream: send N chunks, then an error event
    error_event: Any = None  # that event's JSON (default: OpenAI's error shape), or a function of the request's headers
    hang_after_chunks: int | None = None  # stream: send N chunks, then stall until the client leaves
    end_after_chunks: int | None = None  # stream: send N chunks, then end the body without [DONE]
    finish_last: bool = False  # with end_after_chunks: the last chunk has a finish_reason
    alternate_choices: bool = False  # the chunks alternate between choices 0 and 1 (n=2)
    tier_from_chunk: int = 0  # stream: the chunks before this one name no service tier (as Azure's first)
    silence: tuple[int, float] | None = None  # stream: after N body messages, nothing for S seconds, then the rest


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    json: Any


@dataclass
class StreamRecord:
    path: str
    done: threading.Event = field(default_factory=threading.Event)
    completed: bool | None = None  # False: the client disconnected first

    def wait(self, timeout: float = 10.0) -> bool:
        return self.done.wait(timeout)


class FakeUpstream(EchoUpstream, OnLoopback):
    def __init__(self) -> None:
        super().__init__(EchoOptions())
        self.faults: deque[Fault] = deque()
        self.received: list[Received] = []
        self.streams: list[StreamRecord] = []
        self.rich = False  # answer with today's full response shape (RICH_* below)
        self.byte_tokens = False  # count a chat prompt as a tokenizer at its worst would: a token a UTF-8 byte
        self.answer_headers: dict[str, str] = {}  # added to the head of every answer
        self.in_flight = 0  # requests received and not yet answered to the end
        self.peak_in_flight = 0  # the most of them at once since the last ``reset``

    # ------------------------------------------------------------ control

    def reset(self) -> None:
        self.options = EchoOptions()
        self.rich = False
        self.byte_tokens = False
        self.answer_headers = {}
        self.faults.clear()
        self.received.clear()
        self.streams.clear()
        self.peak_in_flight = self.in_flight

    def fail_next(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    @property
    def last(self) -> Received:
        return self.received[-1]

    # ------------------------------------------------------------ behaviour

    def prompt_text(self, payload: dict[str, Any], chat: bool) -> tuple[str, int]:
        text, count = super().prompt_text(payload, chat)
        if self.byte_tokens and chat:
            messages = [m for m in payload.get("messages") or [] if isinstance(m, dict)]
            count = sum(len(str(m.get("content") or "").encode()) + 4 for m in messages)
        return text, count

    async def handle(self, ex: Exchange) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await self._handle(ex)
        finally:
            self.in_flight -= 1

    async def _handle(self, ex: Exchange) -> None:
        try:
            payload = ex.json()
        except ValueError:
            payload = None
        self.received.append(Received(ex.method, ex.path, ex.headers, payload))
        if self.answer_headers:
            ex = dataclasses.replace(ex, send=with_headers(ex.send, self.answer_headers))
        fault = self.faults.popleft() if self.faults else None
        if fault is None:
            return await self._answer(ex, payload, None)
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.silence is not None:
            ex = dataclasses.replace(ex, send=silent_after(ex.send, *fault.silence))
        if fault.status is not None:
            body = fault.body(ex.headers) if callable(fault.body) else fault.body
            body = body if body is not None else error_body(f"injected {fault.status}", "injected")
            if isinstance(body, bytes):
                await ex.send({"type": "http.response.start", "status": fault.status,
                               "headers": [(k.encode(), v.encode()) for k, v in fault.headers.items()]})
                return await ex.send({"type": "http.response.body", "body": body, "more_body": False})
            return await send_json(ex, fault.status, body, fault.headers)
        await self._answer(ex, payload, fault)

    async def _answer(self, ex: Exchange, payload: Any, fault: Fault | None) -> None:
        if self.rich and ex.method == "POST" and isinstance(payload, dict) and ex.path.endswith("completions"):
            return await self._rich(ex, payload)
        if not (isinstance(payload, dict) and payload.get("stream")) or ex.method != "POST":
            return await super().handle(ex)
        record = StreamRecord(ex.path)
        self.streams.append(record)
        try:
            if fault and any(n is not None for n in (fault.error_after_chunks, fault.hang_after_chunks,
                                                     fault.end_after_chunks)):
                record.completed = await self._faulty_stream(ex, payload, fault)
            else:
                record.completed = await self.stream(ex, payload, ex.path.endswith("/chat/completions"))
        finally:
            record.done.set()

    async def _rich(self, ex: Exchange, payload: dict[str, Any]) -> None:
        await _rich_answer(ex, payload)

    async def _faulty_stream(self, ex: Exchange, payload: dict[str, Any], fault: Fault) -> bool:
        chat = ex.path.endswith("/chat/completions")
        out, _, _ = self.output(payload, chat)
        await ex.send({"type": "http.response.start", "status": 200,
                       "headers": [(b"content-type", b"text/event-stream")]})
        count = next((n for n in (fault.error_after_chunks, fault.hang_after_chunks, fault.end_after_chunks)
                      if n is not None), 0)
        for i, piece in enumerate((out * (count or 1))[:count]):
            finish = "stop" if fault.finish_last and i == count - 1 else None
            index = i % 2 if fault.alternate_choices else 0
            chunk = ({"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 0, "model": "m",
                      "choices": [{"index": index, "delta": {"content": piece}, "finish_reason": finish}]} if chat else
                     {"id": "cmpl-f", "object": "text_completion", "created": 0, "model": "m",
                      "choices": [{"index": index, "text": piece, "finish_reason": finish}]})
            if "service_tier" in payload and i >= fault.tier_from_chunk:
                chunk["service_tier"] = served_tier(payload)
            await ex.send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                           "more_body": True})
        if fault.end_after_chunks is not None:
            await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
            return True
        if fault.error_after_chunks is not None:
            event = fault.error_event(ex.headers) if callable(fault.error_event) else fault.error_event
            if event is None:
                event = error_body("injected mid-stream failure", "injected", "server_error")
            await ex.send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                           "more_body": False})
            return True
        while (await ex.receive())["type"] != "http.disconnect":
            pass
        return False


def chat_chunks(*choices: dict[str, Any], usage: dict[str, Any] | None = None) -> Fault:
    """The next answer: a chat stream of one chunk per ``choices`` entry (a choice's ``delta`` and
    what goes with it: ``finish_reason``, ``stop_reason``; its index is 0), then the ``usage``
    chunk (``choices: []``) if given, then ``[DONE]``: an upstream's stream scripted chunk by chunk."""
    envelope = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [envelope | {"choices": [{"index": 0, "finish_reason": None} | c]} for c in choices]
    if usage is not None:
        chunks.append(envelope | {"choices": [], "usage": usage})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return Fault(status=200, headers={"content-type": "text/event-stream"}, body=body)


def chat_answer(message: dict[str, Any], finish: str | None, **choice: Any) -> Fault:
    """The next answer: a whole chat completion of ``message`` (``choice``: more of its choice's fields)."""
    return Fault(status=200, body={"id": "chatcmpl-s", "object": "chat.completion", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "message": message, "finish_reason": finish} | choice]})


def silent_after(send: Any, messages: int, seconds: float) -> Any:
    """An ASGI ``send`` that says nothing for ``seconds`` after the response's first ``messages`` body
    messages (an upstream gone silent mid-stream: a model thinking), then sends the rest."""
    sent = 0

    async def sending(message: dict[str, Any]) -> None:
        nonlocal sent
        if message["type"] == "http.response.body":
            if sent == messages:
                await asyncio.sleep(seconds)
            sent += 1
        await send(message)

    return sending


def with_headers(send: Any, headers: dict[str, str]) -> Any:
    """An ASGI ``send`` that adds ``headers`` to the response's head."""
    extra = [(k.encode(), v.encode()) for k, v in headers.items()]

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = message | {"headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


# ---------------------------------------------------------------- today's full response shape

RICH_USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13,
              "prompt_tokens_details": {"cached_tokens": 2, "audio_tokens": 0},
              "completion_tokens_details": {"reasoning_tokens": 3, "audio_tokens": 0,
                                            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
RICH_LOGPROBS = {"content": [{"token": "hi", "logprob": -0.1, "bytes": [104, 105], "top_logprobs": []}],
                 "refusal": None}
RICH_MESSAGE = {"role": "assistant", "content": "hi", "refusal": None, "reasoning_content": "thought about it",
                "annotations": [{"type": "url_citation",
                                 "url_citation": {"url": "https://example.com", "title": "Example",
                                                  "start_index": 0, "end_index": 2}}]}


def served_tier(payload: dict[str, Any]) -> str:
    """The service tier OpenAI says it served a request at: the one asked for, "default" for "auto" or none."""
    asked = payload.get("service_tier")
    return asked if asked in ("priority", "flex", "scale") else "default"


async def _send_events(ex: Exchange, events: list[dict[str, Any]]) -> None:
    await ex.send({"type": "http.response.start", "status": 200,
                   "headers": [(b"content-type", b"text/event-stream")]})
    for event in events:
        await ex.send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                       "more_body": True})
    await ex.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _rich_answer(ex: Exchange, payload: dict[str, Any]) -> None:
    chat = ex.path.endswith("/chat/completions")
    base = {"id": "chatcmpl-rich" if chat else "cmpl-rich", "created": 1700000000, "model": payload.get("model"),
            "service_tier": served_tier(payload), "system_fingerprint": "fp_rich", "kv_transfer_params": None}
    if not payload.get("stream"):
        if chat:
            choice = {"index": 0, "message": RICH_MESSAGE, "finish_reason": "stop", "logprobs": RICH_LOGPROBS,
                      "stop_reason": None}
        else:
            choice = {"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None, "stop_reason": "END",
                      "prompt_logprobs": None}
        body = base | {"object": "chat.completion" if chat else "text_completion", "choices": [choice],
                       "usage": RICH_USAGE, "prompt_logprobs": None}
        return await send_json(ex, 200, body)
    kind = {"object": "chat.completion.chunk" if chat else "text_completion", "usage": None}
    if chat:
        deltas = [{"role": "assistant", "content": "", "refusal": None},
                  {"reasoning_content": "thought"}, {"content": "hi"}]
        events = [base | kind | {"choices": [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]}
                  for d in deltas]
        events.append(base | kind | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                                  "stop_reason": None, "logprobs": None}]})
    else:
        events = [base | kind | {"choices": [{"index": 0, "text": "hi", "finish_reason": None, "logprobs": None}]},
                  base | kind | {"choices": [{"index": 0, "text": "", "finish_reason": "stop", "stop_reason": "END",
                                              "logprobs": None}]}]
    events.append(base | kind | {"choices": [], "usage": RICH_USAGE})
    await _send_events(ex, events)
