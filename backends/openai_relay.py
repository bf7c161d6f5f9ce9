"""An OpenAI-compatible upstream's stream, chunk by chunk: ``ChunkReader`` decodes its ``data:``
events, ``ChunkRelay`` relays them (pulled, or pushed from the connection's callback), keeping the
meter current and usage where the client asked for it: with ``include_usage`` (and not vLLM's
``continuous_usage_stats``), one closing chunk with no choices, however the upstream reported it (on
every chunk, on the finishing chunk, or not at all: the meter's estimate then).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import UNSET

from backends.base import Interrupted, Meter, RelayedFailure, Unavailable, UpstreamError
from backends.estimate import estimate_text
from backends.http_upstream import ErrorDetail, ErrorEnvelope, HTTPUpstream, parse_error
from backends.openai_usage import meter_from_usage, without_null_counts
from backends.openai_wire import ChatCompletionChunk, TextCompletion, Usage, relayed, set_relayed
from backends.raw_stream import RawStream
from backends.redaction import redact_json
from backends.sse import WAIT, SSELines

C = TypeVar("C", ChatCompletionChunk, TextCompletion)

_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_NULL = msgspec.Raw(b"null")
_NO_CHOICES = msgspec.Raw(b"[]")


def tier_field(obj: Any) -> msgspec.Raw | None:
    """An upstream answer's (or chunk's) ``service_tier`` field as it came, None when it has none."""
    raw = relayed(obj)
    return raw.get("service_tier") if raw is not None else None


def served_tier(sent: msgspec.Raw | None) -> str | None:
    """The service tier a ``service_tier`` field says the request was served at (``"priority"``), None
    when it names none."""
    if sent is None:
        return None
    try:
        tier = msgspec.json.decode(sent)
    except msgspec.DecodeError:
        return None
    return tier if isinstance(tier, str) and tier else None


def keep_relayed(obj: Any, data: bytes) -> None:
    """Keep an answer's or chunk's ``data`` on ``obj`` to relay as it came; one that carries an
    error (OpenRouter's failure, whole or mid-stream) with every provider secret masked in it."""
    raw = _raw_object.decode(data)
    if (error := raw.get("error")) is not None and error != _NULL:  # a dict lookup: no scan of the chunk
        raw = _raw_object.decode(data := redact_json(data))
    set_relayed(obj, raw, data)


class ChunkReader:
    """Decodes each ``data:`` event into a chunk Struct; an ``{"error": ...}`` event raises."""

    def __init__(self, response: RawStream, type_: type[Any], idle: float) -> None:
        self._lines = SSELines(response, idle)
        self._decoder = msgspec.json.Decoder(type_)

    async def next(self, deadline: float) -> Any:
        data = await self._lines.next(deadline)
        return None if data is None else self._decode(data)

    def poll(self) -> Any:
        """``next`` without waiting: a chunk if a whole one has arrived, None at the end, else WAIT."""
        data = self._lines.poll()
        return data if data is None or data is WAIT else self._decode(data)  # type: ignore[arg-type]

    @property
    def lines(self) -> SSELines:
        return self._lines

    def _decode(self, data: bytes) -> Any:
        try:
            chunk = self._decoder.decode(data)
        except (msgspec.MsgspecError, RecursionError) as exc:
            chunk = self._decode_failed(data, exc)
        keep_relayed(chunk, data)
        return chunk

    def _decode_failed(self, data: bytes, exc: Exception) -> Any:
        """A chunk that did not decode: one whose usage holds a count sent as null (left out),
        decoded without it; else the failure it names (or its invalidity) raised."""
        try:
            return self._decoder.decode(without_null_counts(data))
        except (msgspec.MsgspecError, RecursionError):
            try:
                envelope = msgspec.json.decode(data, type=ErrorEnvelope)
            except (msgspec.MsgspecError, RecursionError):
                raise UpstreamError(f"the upstream sent an invalid chunk: {exc}") from None
            error = envelope.error if isinstance(envelope.error, ErrorDetail) else ErrorDetail(envelope.error)
            raise UpstreamError(f"the upstream failed mid-stream: {error.message}") from None

    def close(self) -> None:
        self._lines.close()


@dataclass(frozen=True)
class UsageWanted:
    """The usage a client asked for in a stream: the closing usage chunk (``include_usage``), the
    usage each chunk carries (vLLM's ``continuous_usage_stats``)."""

    final: bool
    per_chunk: bool


class ChunkRelay(Generic[C]):
    """Relays upstream chunks, keeping the meter current and usage chunks as the client asked:
    pulled (``__anext__``) or pushed as they arrive (``push``).

    ``aclose()`` (also before the first ``__anext__``) closes the upstream response.
    """

    def __init__(self, http: HTTPUpstream, response: RawStream, reader: ChunkReader, first: C,
                 deadline: float, meter: Meter, usage: UsageWanted, text_of: Callable[[C], str]) -> None:
        self._http, self._response, self._reader = http, response, reader
        self._pending: C | None = first
        self._last: C = first
        self._unfinished: set[int] = set()  # indices of the choices seen whose finish_reason has not come
        self._began = False  # a chunk with a choice came (not only Azure's first, its prompt filter results)
        self._deadline, self._meter, self._usage = deadline, meter, usage
        self._text_of: Callable[[C], str] = text_of
        self._usage_sent = False  # the closing usage chunk (no choices) was relayed
        self._reported: tuple[C, Usage] | None = None  # the last usage sent on a chunk with choices, and it
        self._estimating = True  # the completion counted from the text, until a usage holds its count
        # chunks still read for the service tier until one names it: the first two (Azure's first,
        # its prompt filter results, names none), then only the usage chunk (a per-chunk cost saved)
        self._tier_reads = 2
        self._closed = False
        self._failure: BaseException | None = None  # met while pushing: raised by the next __anext__
        self._upstream_failure: RelayedFailure | None = None  # an error chunk relayed (``failure``)
        self._note_tier(first)

    def __aiter__(self) -> ChunkRelay[C]:
        return self

    async def __anext__(self) -> C:
        if self._closed:
            raise StopAsyncIteration
        try:
            if (failure := self._failure) is not None:
                self._failure = None
                raise failure
            while True:
                chunk = self._pending if self._pending is not None else await self._reader.next(self._deadline)
                self._pending = None
                if chunk is None:
                    self._check_finished()
                    break
                if (out := self._account(chunk)) is not None:
                    return out
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        if self._usage.final and not self._usage_sent:
            return self._closing_usage_chunk()
        raise StopAsyncIteration

    async def push(self, sink: Callable[[C], bool]) -> None:
        """Hand each chunk to ``sink`` as soon as it arrives, inside the upstream connection's
        callback (no task switch per chunk), until ``sink`` returns False, the stream ends or fails,
        or this task is cancelled; then return, and ``__anext__`` goes on from there (an end or a
        failure met here is met again, or raised, by the next ``__anext__``)."""
        if self._closed or self._pending is not None or self._failure is not None:
            return
        reader = self._reader
        reader.lines.arm(self._deadline)

        def relay_arrived() -> bool:
            try:
                while (chunk := reader.poll()) is not WAIT:
                    if chunk is None:
                        return False
                    if (out := self._account(chunk)) is not None and not sink(out):
                        return False
                return True
            except Exception as exc:  # raised by the next __anext__, in the task
                self._failure = exc
                return False

        if relay_arrived():
            await reader.lines.content.wait(relay_arrived)

    def interrupt(self) -> None:
        """Have a read that waits for the upstream give up now (from a callback): ``push`` returns,
        ``__anext__`` raises ``Interrupted``, and so does every read after them."""
        self._response.set_exception(Interrupted())

    @property
    def unfinished(self) -> set[int]:
        """The indices of the choices relayed whose ``finish_reason`` has not come (for a stream cut short)."""
        return self._unfinished

    @property
    def failure(self) -> RelayedFailure | None:
        """The upstream failed the stream in a chunk relayed as it came (OpenRouter's: a choice
        finished for ``"error"``, an ``error`` beside it), however the stream ended: settled as failed."""
        return self._upstream_failure

    def _failed(self, chunk: C) -> None:
        raw = relayed(chunk)
        error = raw.get("error") if raw is not None else None
        message = parse_error(b'{"error":%s}' % bytes(error)).message if error is not None else ""
        self._upstream_failure = RelayedFailure(
            f"upstream {self._http.deployment_id} failed mid-stream" + (f": {message}" if message else ""))

    def _check_finished(self) -> None:
        """At the end of the body: a stream that ended without ``[DONE]`` while a choice it had
        begun had no ``finish_reason`` yet, or before any choice began, was cut short, not completed."""
        if not self._reader.lines.saw_done and (self._unfinished or not self._began):
            raise Unavailable("the upstream ended the stream before it finished")

    def _account(self, chunk: C) -> C | None:
        """Update the meter from one chunk; the chunk to relay, or None to drop it."""
        meter = self._meter
        self._last = chunk
        if chunk.choices:
            self._began = True
        for choice in chunk.choices:
            if choice.finish_reason is None:
                self._unfinished.add(choice.index)
            else:
                self._unfinished.discard(choice.index)
                if choice.finish_reason == "error":
                    self._failed(chunk)
        if self._tier_reads and meter.service_tier is None:
            self._tier_reads -= 1
            self._note_tier(chunk)
        if text := self._text_of(chunk):
            if meter.first_token_at is None:
                meter.first_token_at = time.perf_counter()
            if self._estimating:
                meter.completion_tokens += estimate_text(text)
        usage = chunk.usage
        if usage is UNSET:
            return chunk
        if isinstance(usage, Usage):
            self._estimating = not meter_from_usage(meter, usage, chunk)[1]
            if meter.service_tier is None:
                self._note_tier(chunk)
            if not chunk.choices:  # the closing usage chunk (not Azure's first, usage null)
                self._usage_sent = self._usage.final
                return chunk if self._usage.final else None
            self._reported = (chunk, usage)
        if not self._usage.per_chunk and (usage is not None or not self._usage.final):
            chunk.usage = UNSET  # a usage field sent, even null, is not relayed; asked for, it comes last
        return chunk

    def _note_tier(self, chunk: C) -> None:
        """The service tier a chunk names, onto the meter (a stream may end without a usage chunk)."""
        self._meter.service_tier = served_tier(tier_field(chunk)) or self._meter.service_tier

    def _closing_usage_chunk(self) -> C:
        """The usage chunk the client asked for, where the upstream sent none: the usage it reported
        on a chunk with choices (its other fields as it sent them), else our estimate."""
        if self._reported is None:
            m = self._meter
            usage = Usage(prompt_tokens=m.prompt_tokens, completion_tokens=m.completion_tokens,
                          total_tokens=m.total_tokens)
            return msgspec.structs.replace(self._last, choices=[], usage=usage)
        chunk, usage = self._reported
        closing = msgspec.structs.replace(chunk, choices=[], usage=usage)
        if (raw := relayed(chunk)) is not None:
            set_relayed(closing, raw | {"choices": _NO_CHOICES})
        return closing

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._reader.close()
            await self._http.close_stream(self._response)
