"""Server-sent events: relay a backend's ChunkStream to the client as ``data: {...}`` lines.

The relay never raises into the ASGI server: a provider failure after the first chunk becomes an
OpenAI-shaped ``data: {"error": ...}`` event (the openai SDK raises it as an APIError). ``finish()``
runs as the response's background task, after the last byte or after the client disconnected,
and is where the upstream is closed and the request is settled.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import Enum
from typing import Any, Protocol

import msgspec

from backends.base import BackendError, ChunkStream, Meter
from backends.openai_wire import encode_answer
from gateway.errors import ApiError, from_backend_error

log = logging.getLogger("switchyard.streaming")

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


class Outcome(Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    DISCONNECTED = "client_disconnected"


OnEnd = Callable[[Meter, Outcome, ApiError | None], Awaitable[None]]


def sse_event(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


class StreamEncoder(Protocol):
    """Turns relayed chunks into the bytes of one SSE dialect (OpenAI's, or Anthropic's)."""

    def chunk(self, chunk: Any) -> bytes: ...

    def done(self) -> bytes: ...

    def error(self, error: ApiError) -> bytes: ...


class OpenAIEvents:
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
                 encoder: StreamEncoder | None = None) -> None:
        self._stream = stream
        self._model = public_model
        self._on_end = on_end
        self._encoder = encoder or OpenAIEvents()
        self._outcome = Outcome.DISCONNECTED  # until the generator says otherwise
        self._error: ApiError | None = None
        self._finished = False

    async def events(self) -> AsyncIterator[bytes]:
        encoder = self._encoder
        try:
            async for chunk in self._stream:
                chunk.model = self._model
                if data := encoder.chunk(chunk):
                    yield data
        except BackendError as exc:
            self._fail(from_backend_error(exc))
            yield encoder.error(self._error)  # type: ignore[arg-type]
            return
        except Exception:
            log.exception("stream relay failed")
            self._fail(ApiError(500, "internal error while streaming", code="internal_error"))
            yield encoder.error(self._error)  # type: ignore[arg-type]
            return
        self._outcome = Outcome.COMPLETED
        await self.finish()  # settled and its usage durable before the last byte
        yield encoder.done()

    def _fail(self, error: ApiError) -> None:
        self._outcome, self._error = Outcome.FAILED, error

    async def finish(self) -> None:
        """Close the upstream and report the outcome; idempotent."""
        if self._finished:
            return
        self._finished = True
        try:
            await self._stream.aclose()
        except Exception:
            log.exception("closing the upstream stream failed")
        await self._on_end(self._stream.meter, self._outcome, self._error)
