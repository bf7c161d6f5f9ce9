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
from typing import Any

import msgspec

from backends.base import BackendError, ChunkStream, Meter
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


class SSERelay:
    def __init__(self, stream: ChunkStream[Any], public_model: str, on_end: OnEnd) -> None:
        self._stream = stream
        self._model = public_model
        self._on_end = on_end
        self._outcome = Outcome.DISCONNECTED  # until the generator says otherwise
        self._error: ApiError | None = None
        self._finished = False

    async def events(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                chunk.model = self._model
                yield sse_event(chunk)
        except BackendError as exc:
            self._fail(from_backend_error(exc))
            yield sse_event(self._error.body())  # type: ignore[union-attr]
            return
        except Exception:
            log.exception("stream relay failed")
            self._fail(ApiError(500, "internal error while streaming", code="internal_error"))
            yield sse_event(self._error.body())  # type: ignore[union-attr]
            return
        self._outcome = Outcome.COMPLETED
        yield DONE

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
