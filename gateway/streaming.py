"""Server-sent events: relay a backend's ChunkStream to the client as ``data: {...}`` lines.

The relay never raises into the ASGI server: a provider failure after the first chunk becomes an
OpenAI-shaped ``data: {"error": ...}`` event (the openai SDK raises it as an APIError). ``finish()``
closes the upstream and settles the request: before the last byte when the stream ends (so its
usage is durable first), else as the response's background task, after the client disconnected.
While the process drains (``gateway.drain``), each read races the drain time; a stream still
running when it ends is cut with a last chunk carrying ``finish_reason: length`` and the usage. A
read begun before the drain (a silent upstream: a model thinking) does not race it: the drain
interrupts it when its time ends, where the stream's chunks can be interrupted (``interrupt()``: an
HTTP upstream's, an Anthropic one's, the engine's).

Served by ``switchyard serve``, a stream's chunks after the first go from the upstream's connection
callback straight to the client's (``SSERelay.write_directly``), with no task switch per chunk.
There, a stream that writes its client nothing for a while (its upstream silent) is written
keep-alives (``gateway.keepalive``): its dialect's ``keep_alive``, which no SDK shows its user; they
are not chunks (nothing metered, no event numbered).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from enum import Enum
from typing import Any, Protocol

import msgspec

from backends.base import BackendError, ChunkStream, Interrupted, Meter
from backends.openai_wire import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChoice,
    TextCompletion,
    Usage,
    encode_answer,
)
from gateway.drain import DRAIN, is_cut
from gateway.errors import ApiError, from_backend_error
from gateway.event_stream import WriteNow
from gateway.keepalive import KeepAlives

log = logging.getLogger("switchyard.streaming")

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it (the openai SDK's decoder does)
_encoder = msgspec.json.Encoder()


class Outcome(Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    DISCONNECTED = "client_disconnected"
    DRAINED = "drained"  # cut when the process's drain time ran out


OnEnd = Callable[[Meter, Outcome, ApiError | None], Awaitable[None]]


def sse_event(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


class StreamEncoder(Protocol):
    """Turns relayed chunks into the bytes of one SSE dialect (OpenAI's, or Anthropic's)."""

    keep_alive: bytes  # written while the stream is silent (``gateway.keepalive``): an event its clients skip

    def chunk(self, chunk: Any) -> bytes: ...

    def done(self) -> bytes:
        """The stream's last events. A ``BackendError`` (an answer the dialect cannot express) fails
        the stream instead: it is settled as failed and ends with ``error``'s event."""
        ...

    def error(self, error: ApiError) -> bytes: ...


class OpenAIEvents:
    last_event = DONE  # what ``done`` returns, always
    keep_alive = KEEP_ALIVE

    def __init__(self, meter: Meter | None = None) -> None:
        pass

    def chunk(self, chunk: Any) -> bytes:
        return b"data: " + encode_answer(chunk) + b"\n\n"  # an upstream's chunk keeps every field it sent

    def done(self) -> bytes:
        return DONE

    def error(self, error: ApiError) -> bytes:
        return sse_event(error.body())


class SSERelay:
    def __init__(self, stream: ChunkStream[Any], public_model: str, on_end: OnEnd,
                 encoder: StreamEncoder | None = None, on_first: Callable[[Any], None] | None = None,
                 keepalives: KeepAlives | None = None) -> None:
        self._stream = stream
        self._on_first = on_first  # shown the first chunk as the provider sent it (its model, for a span)
        self._model = public_model
        self._on_end = on_end
        self._encoder = encoder or OpenAIEvents()
        self._outcome = Outcome.DISCONNECTED  # until the generator says otherwise
        self._error: ApiError | None = None
        self._finished = False
        self._last: Any = None  # the last chunk relayed
        self._write_now: WriteNow | None = None
        self._pushing = False  # the stream's chunks are written from its callbacks (``write_directly``)
        self._held: bytes | None = None  # pushed, but the client could not take it then
        self._keepalives = keepalives  # None: no keep-alives
        self._wrote = True  # something was written since the keep-alives' last visit (the head, at first)

    @property
    def last_event(self) -> bytes | None:
        """The event a completed stream ends with, when the dialect's is always the same (OpenAI's
        ``[DONE]``): ``gateway.event_stream`` sends it with the end of the body."""
        return getattr(self._encoder, "last_event", None)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.events()

    def write_directly(self, write_now: WriteNow, push: bool = True) -> None:
        """From the second chunk on, relay each chunk to the client with ``write_now`` inside the
        upstream connection's callback, where the stream can push (``ChunkRelay.push``): no task
        switch per chunk. Anything else (the end, a failure, a full client buffer, the drain)
        comes back to ``events``. ``write_now`` writes the keep-alives too; with ``push`` False,
        only them (every chunk then goes through ``events``: ``SavedBeforeLast``)."""
        self._write_now = write_now
        self._pushing = push

    async def events(self) -> AsyncIterator[bytes]:
        encoder = self._encoder
        push: Callable[[Callable[[Any], bool]], Awaitable[None]] | None = (
            getattr(self._stream.chunks, "push", None) if self._pushing else None)
        on_first = self._on_first
        DRAIN.wakers.add(self._interrupt)
        if self._keepalives is not None and self._write_now is not None:  # the response has begun
            self._keepalives.add(self._beat)
        try:
            try:
                async for chunk in self._stream:
                    if on_first is not None:
                        on_first(chunk)
                        on_first = None
                    chunk.model = self._model
                    if data := encoder.chunk(chunk):
                        self._wrote = True
                        yield data
                    self._last = chunk
                    if DRAIN.draining:
                        break
                    if push is not None:
                        await push(self._pushed)
                        if (held := self._held) is not None:
                            self._held = None
                            yield held
                        if DRAIN.draining:
                            break
            except Interrupted:  # the drain time ended while a read waited: the cut below
                pass
            DRAIN.wakers.discard(self._interrupt)  # from here on each read races the drain time
            if DRAIN.draining:  # the process is shutting down: the rest races its drain time
                while not is_cut(chunk := await _next_or_stop(self._stream)):
                    if chunk is _END:
                        break
                    chunk.model = self._model
                    if data := encoder.chunk(chunk):
                        self._wrote = True
                        yield data
                    self._last = chunk
                else:
                    self._outcome = Outcome.DRAINED
                    await self.finish()  # the provider closed, the request settled
                    unfinished = getattr(self._stream.chunks, "unfinished", None)
                    if (final := cut_chunk(self._last, self._stream.meter, unfinished)) is not None:
                        yield encoder.chunk(final)
                    yield encoder.done()
                    return
            end = encoder.done()  # before the settlement: an answer the dialect cannot end fails
        except BackendError as exc:
            self._fail(from_backend_error(exc))
            yield encoder.error(self._error)  # type: ignore[arg-type]
            return
        except Exception:
            log.exception("stream relay failed")
            self._fail(ApiError(500, "internal error while streaming", code="internal_error"))
            yield encoder.error(self._error)  # type: ignore[arg-type]
            return
        finally:
            DRAIN.wakers.discard(self._interrupt)
        if (failure := getattr(self._stream.chunks, "failure", None)) is not None:  # in a chunk relayed as it came
            self._fail(from_backend_error(failure))
        else:
            self._outcome = Outcome.COMPLETED
        await self.finish()  # settled and its usage durable before the last byte
        yield end

    def _interrupt(self) -> None:
        """The drain time ended while the stream may wait on a read that does not race it: end the
        wait, so that ``events`` cuts the stream."""
        if (interrupt := getattr(self._stream.chunks, "interrupt", None)) is not None:
            interrupt()

    def _pushed(self, chunk: Any) -> bool:
        """A chunk the stream pushed: written to the client now; False when ``events`` must take over."""
        chunk.model = self._model
        self._last = chunk
        if data := self._encoder.chunk(chunk):
            self._wrote = True
            if not self._write_now(data):  # type: ignore[misc]  # set when pushing
                self._held = data
                return False
        return not DRAIN.draining

    def _beat(self) -> None:
        """The keep-alives' visit (``gateway.keepalive``): the dialect's keep-alive written if the
        stream wrote nothing since the last one. It goes through the writer the chunks take (framed
        as they are), whole: the loop runs one callback at a time, and each chunk is written in one.
        None when the writer cannot take it now (a full client buffer: bytes are on their way)."""
        if self._wrote:
            self._wrote = False
        else:
            self._write_now(self._encoder.keep_alive)  # type: ignore[misc]  # set when visited

    def _fail(self, error: ApiError) -> None:
        self._outcome, self._error = Outcome.FAILED, error

    async def finish(self) -> None:
        """Close the upstream and report the outcome; idempotent. Awaited in the response's own task,
        not shielded in a task of its own (three loop turns before the stream's last bytes): a
        cancellation while the upstream closes still reports the outcome, as a unary answer's does."""
        if self._finished:
            return
        self._finished = True
        if self._keepalives is not None:
            self._keepalives.discard(self._beat)
        try:
            await self._stream.aclose()
        except Exception:
            log.exception("closing the upstream stream failed")
        finally:
            await self._on_end(self._stream.meter, self._outcome, self._error)


_END = object()


async def _next_or_stop(stream: ChunkStream[Any]) -> Any:
    try:
        return await DRAIN.next_or_cut(stream.chunks)
    except StopAsyncIteration:
        return _END


def cut_chunk(last: Any, meter: Meter, unfinished: set[int] | None = None) -> Any:
    """The last chunk of a stream cut short: the choices still ``unfinished`` (where the stream
    knows them; else every choice of ``last``) finished for ``length``, with the usage the meter
    holds (None when nothing was relayed, or for a chunk type not known here: its dialect's ``done``
    ends the stream)."""
    if not isinstance(last, ChatCompletionChunk | TextCompletion):
        return None
    usage = Usage(prompt_tokens=meter.prompt_tokens, completion_tokens=meter.completion_tokens,
                  total_tokens=meter.prompt_tokens + meter.completion_tokens)
    indices = sorted(unfinished) if unfinished is not None else sorted({c.index for c in last.choices}) or [0]
    if isinstance(last, ChatCompletionChunk):
        choices = [ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason="length") for i in indices]
        return ChatCompletionChunk(id=last.id, model=last.model, choices=choices, created=last.created, usage=usage)
    text = [CompletionChoice(index=i, text="", finish_reason="length") for i in indices]
    return TextCompletion(id=last.id, model=last.model, choices=text, created=last.created, usage=usage)


class SavedBeforeLast:
    """Relays ``events``; ``save`` is awaited once ``finished`` holds the response their last event
    completes (their encoder put it there), before that event is sent: a client that acts on it at
    once (continues from it, asks for it) finds it stored. An ``SSERelay``'s chunks all come
    through here, none written from its upstream's callbacks (that event would pass before it is
    saved); the relay writes its keep-alives itself."""

    def __init__(self, events: AsyncIterable[bytes], finished: list[Any],
                 save: Callable[[], Awaitable[object]]) -> None:
        self._events, self._finished, self._save = events, finished, save

    def write_directly(self, write_now: WriteNow) -> None:
        """``gateway.event_stream``'s offer of the server's writer, taken for the keep-alives alone."""
        if isinstance(self._events, SSERelay):
            self._events.write_directly(write_now, push=False)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._relayed()

    async def _relayed(self) -> AsyncIterator[bytes]:
        saved = False
        async for data in self._events:
            if self._finished and not saved:
                saved = True
                await self._save()
            yield data
