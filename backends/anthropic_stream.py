"""An ``anthropic`` deployment's streams: Anthropic's Messages SSE events translated event by
event to OpenAI ``chat.completion.chunk``s (``message_start`` -> role chunk, ``content_block_delta``
-> content / tool-call deltas, ``message_delta`` -> finish reason and output usage), so nothing is
buffered; a stream that ends without ``message_stop`` was cut short and fails (Unavailable); the
events a /v1/messages client is relayed that came before a failure reach it first. A read that
waits for the upstream can be given up from a callback (``interrupt``: the drain's end).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from backends.anthropic_thinking import redacted_delta, thinking_delta
from backends.anthropic_wire import STOP_REASONS, meter_billing, usage_of
from backends.base import BackendError, Interrupted, Meter, RateLimited, Unavailable, UpstreamError
from backends.estimate import estimate_text
from backends.http_upstream import HTTPBackend
from backends.openai_wire import (
    ANTHROPIC_EVENTS,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    PromptTokensDetails,
    ToolCallDelta,
    Usage,
)
from backends.raw_stream import RawStream
from backends.sse import SSELines

Shape = Callable[[ChatDelta, str | None], tuple[ChatDelta, str | None]]  # a streamed delta and finish, reshaped


class Events:
    """Anthropic SSE events (``event: <type>`` / ``data: {...}``), decoded to dicts."""

    def __init__(
        self, response: RawStream, first_deadline: float, deadline: float, idle: float
    ) -> None:
        self.response = response
        self._lines = SSELines(response, idle)
        self._deadline = first_deadline  # until the first event, then the total deadline
        self._total = deadline

    async def next(self) -> dict[str, Any] | None:
        data = await self._lines.next(self._deadline)
        self._deadline = self._total
        if data is None:
            return None
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            raise UpstreamError("the upstream sent an invalid event") from None
        if not isinstance(event, dict):
            raise UpstreamError("the upstream sent an invalid event")
        return event

    def interrupt(self) -> None:
        """Have a read that waits for the upstream give up now (from a callback): it raises
        ``Interrupted``, and so does every read after it."""
        self.response.set_exception(Interrupted())

    def close(self) -> None:
        self._lines.close()


class StreamTranslator:
    """Anthropic stream events -> OpenAI ``chat.completion.chunk``s, metering as they pass. With
    ``keep_events`` (a /v1/messages request) every event also rides on the chunks as it came
    (``ANTHROPIC_EVENTS``): on the first chunk made after it, or on a last chunk without choices."""

    def __init__(self, backend: HTTPBackend, events: Events, model: str, want_usage: bool, meter: Meter,
                 keep_events: bool = False, shape: Shape | None = None) -> None:
        self._backend, self._events, self._model = backend, events, model
        self._shape = shape  # the request used legacy functions or a JSON response_format: deltas in its shape
        self._want_usage, self._meter = want_usage, meter
        self._kept: list[dict[str, Any]] | None = [] if keep_events else None
        self._id = "msg"
        self._pending: list[ChatCompletionChunk] = []
        self._tool_index: dict[int, int] = {}  # content block index -> tool call index
        self._no_arguments: set[int] = set()  # content block indexes of tool calls with no arguments yet
        self._usage: dict[str, Any] = {}
        self._closed = False
        self._primed = False  # the first chunk exists: a failure from now on is mid-stream
        self._ended = False  # message_stop came
        self._failure: BackendError | None = None  # raised once the events read before it are out

    def __aiter__(self) -> StreamTranslator:
        return self

    async def prime(self) -> None:
        """Read until the first chunk exists, so errors before the first byte are raised here."""
        while not self._pending and not self._ended:
            await self._step()
        self._primed = True

    async def __anext__(self) -> ChatCompletionChunk:
        try:
            while not self._pending and not self._ended:
                await self._step()
        except BaseException:
            await self.aclose()
            raise
        if self._pending:
            return self._pending.pop(0)
        await self.aclose()
        raise StopAsyncIteration

    def interrupt(self) -> None:
        """Have a read that waits for the upstream give up now (from a callback): it raises
        ``Interrupted`` (the stream is closed then, as on any failure), and so does every read after
        it that finds no chunk already made."""
        self._events.interrupt()

    def _chunk(self, delta: ChatDelta, finish: str | None = None, stop: Any = None) -> ChatCompletionChunk:
        if self._shape is not None:
            delta, finish = self._shape(delta, finish)
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish)  # a STOP_REASONS value
        if isinstance(stop, str):
            choice.stop_reason = stop  # the stop sequence that matched
        return ChatCompletionChunk(id=self._id, model=self._model, choices=[choice])

    async def _step(self) -> None:
        made = len(self._pending)
        if self._failure is not None:
            raise self._failure
        try:
            event = await self._events.next()
            if event is None and not self._ended:
                raise Unavailable("the upstream ended the stream before message_stop")
            if event is not None and self._kept is not None and event.get("type") != "error":
                self._kept.append(event)  # an error event goes out as the failure it raises
            self._translate(event)
        except BackendError as exc:
            self._fail(exc)
        if self._kept and self._ended and len(self._pending) == made:
            self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[]))
        if self._kept and len(self._pending) > made:
            self._pending[made].__dict__[ANTHROPIC_EVENTS] = self._kept
            self._kept = []

    def _fail(self, exc: BackendError) -> None:
        """A failure mid-stream (an error event, the body ended before ``message_stop``, a broken
        connection): the events read but not yet relayed go out first, in order, on a chunk without
        choices; then it is raised, as any other mid-stream failure (the client gets an error event;
        the request settles as failed). Before the first chunk it is raised at once (it can be retried)."""
        if not self._primed or not self._kept:
            raise exc
        self._failure = exc
        self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[]))

    def _translate(self, event: dict[str, Any] | None) -> None:
        if event is None:
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = str(message.get("id") or self._id)
            self._take_usage(message.get("usage"))  # the real prompt count, from the start
            self._pending.append(self._chunk(ChatDelta(role="assistant", content="")))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if (redacted := redacted_delta(block)) is not None:  # it comes whole
                self._pending.append(self._chunk(redacted))
            elif block.get("type") == "server_tool_use":
                self._count_call(block.get("name"))
            elif block.get("type") == "tool_use":
                index = self._tool_index.setdefault(at := int(event.get("index", 0)), len(self._tool_index))
                self._no_arguments.add(at)
                call = ToolCallDelta(index=index, id=block.get("id", ""), type="function",
                                     function={"name": block.get("name", ""), "arguments": ""})
                self._pending.append(self._chunk(ChatDelta(tool_calls=[call])))
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop" and (at := int(event.get("index", 0))) in self._no_arguments:
            self._no_arguments.discard(at)  # a call of no arguments (input {}): "{}", as a whole answer has
            call = ToolCallDelta(index=self._tool_index[at], function={"arguments": "{}"})
            self._pending.append(self._chunk(ChatDelta(tool_calls=[call])))
        elif kind == "message_delta":
            self._take_usage(event.get("usage"), output=True)
            delta = event.get("delta") or {}
            reason = STOP_REASONS.get(delta.get("stop_reason") or "", "stop")
            self._pending.append(self._chunk(ChatDelta(), reason, delta.get("stop_sequence")))
        elif kind == "message_stop":
            self._finish()
        elif kind == "error":
            error = event.get("error") or {}
            message = f"the upstream failed: {error.get('message', 'stream error')}"
            if error.get("type") == "overloaded_error":
                raise Unavailable(message)
            if error.get("type") == "rate_limit_error":
                raise RateLimited(message)
            raise UpstreamError(message)

    def _take_usage(self, usage: Any, output: bool = False) -> None:
        """A ``usage`` object of the stream's (its counts are the totals so far; a null one is no count,
        as the anthropic SDK reads it): the prompt's tokens, and what is billed apart from plain tokens
        (cache reads and writes, server tool calls), at once: a stream cut short still has them billed.
        With ``output`` (message_delta's), its output count is the answer's, kept though no
        message_stop follows; the meter is exact once both counts came (else they stay estimated)."""
        if isinstance(usage, dict):
            self._usage.update({name: value for name, value in usage.items() if value is not None})
            meter_billing(self._meter, self._usage)
            counted = usage_of(self._usage)
            has_prompt = type(self._usage.get("input_tokens")) is int
            if has_prompt:
                self._meter.prompt_tokens = counted.prompt_tokens
            details = counted.prompt_tokens_details
            self._meter.cached_tokens = details.cached_tokens if isinstance(details, msgspec.Struct) else 0
            if output and type(completion := usage.get("output_tokens")) is int:
                self._meter.completion_tokens, self._meter.exact = completion, has_prompt

    def _count_call(self, tool: Any) -> None:
        """A call of a server tool (a ``server_tool_use`` block), counted as it starts: a stream cut short
        before its usage reports the calls still has them billed (the usage's count replaces these)."""
        if isinstance(tool, str) and tool:
            self._meter.tool_calls[tool] = self._meter.tool_calls.get(tool, 0) + 1

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        if delta.get("type") == "text_delta":
            text = delta.get("text", "")
            if self._meter.first_token_at is None:
                self._meter.first_token_at = time.perf_counter()
            self._meter.completion_tokens += estimate_text(text)
            self._pending.append(self._chunk(ChatDelta(content=text)))
        elif (thinking := thinking_delta(delta)) is not None:  # reasoning_content, and thinking_blocks' pieces
            self._meter.completion_tokens += estimate_text(thinking.reasoning_content or "")
            self._pending.append(self._chunk(thinking))
        elif delta.get("type") == "input_json_delta":
            arguments = delta.get("partial_json", "")
            self._meter.completion_tokens += estimate_text(arguments)
            if (tool := self._tool_index.get(index)) is None:
                # a server tool's input (server_tool_use, mcp_tool_use) is none of the client's calls, as in
                # a whole answer; a /v1/messages client is relayed its events at once all the same
                if self._kept is not None:
                    self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[]))
                return
            if arguments:
                self._no_arguments.discard(index)
            self._pending.append(
                self._chunk(ChatDelta(tool_calls=[ToolCallDelta(index=tool, function={"arguments": arguments})]))
            )

    def _finish(self) -> None:
        if self._ended:
            return
        self._ended = True  # the meter has the usage reported (_take_usage)
        if self._want_usage:
            m = self._meter
            usage = Usage(
                prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens, total_tokens=m.total_tokens
            )
            if m.cached_tokens:  # as a whole answer's usage has them (usage_of)
                usage.prompt_tokens_details = PromptTokensDetails(cached_tokens=m.cached_tokens)
            self._pending.append(ChatCompletionChunk(id=self._id, model=self._model, choices=[], usage=usage))

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._events.close()
            await self._backend.http.close_stream(self._events.response)
