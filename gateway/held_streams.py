"""A background response streamed (``background: true``, ``stream: true``): held as one answered
``queued`` is (``gateway.held_usage``) from the first event of its stream that carries it, before
that event is relayed: ``on_hold`` stores it with its spend ``unsettled``, so that its client (or
another of its tenant) can ``GET`` or ``cancel`` it while it streams, by the id that event gave.
From then on it is metered once, when it ends: by its stream's last event (``on_end``: stored
finished and metered with what the stream metered, before that event is relayed), or by the
``GET``, ``cancel`` or follower that finds it ended first; the request that started it settles at
no tokens. One whose stream ends before its last event (the client gone, the drain, the upstream's
connection broken, the upstream's own ``error`` event) stays held: the upstream may run it on (a client
may resume its stream there; one the gateway cut is told so, ``gateway.dialects.responses_resume``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from backends.base import ChunkStream, Meter
from backends.responses_wire import FINAL_EVENTS, ResponsesEvent
from gateway.held_responses import UNFINISHED

log = logging.getLogger("switchyard.responses")

# Gets the response as its stream's first event tells it, and its prompt's estimate; says whether it is now held.
OnHold = Callable[[dict[str, Any], int], Awaitable[bool]]
# Gets the response as its stream's last event tells it, and what the stream metered: stores and meters it.
OnEnd = Callable[[dict[str, Any], Meter], Awaitable[None]]


async def held_stream(opened: Awaitable[ChunkStream[Any]], on_hold: OnHold, on_end: OnEnd) -> ChunkStream[Any]:
    """The stream ``opened`` gives, its response held from its first event (``HeldStream``)."""
    return HeldStream(await opened, on_hold, on_end)


class _Holding:
    """A stream's events, as they pass: the first that carries a response still running handed to
    ``on_hold``, the last (``FINAL_EVENTS``) of one held so to ``on_end``, each before it is returned."""

    def __init__(self, stream: ChunkStream[Any], on_hold: OnHold, on_end: OnEnd) -> None:
        self._chunks, self._meter = stream.chunks, stream.meter
        self._on_hold, self._on_end = on_hold, on_end
        self._seen = False  # an event carrying the response came
        self.held = False

    def __aiter__(self) -> _Holding:
        return self

    async def __anext__(self) -> Any:
        chunk = await self._chunks.__anext__()
        if isinstance(chunk, ResponsesEvent) and isinstance(response := chunk.data.get("response"), dict):
            if not self._seen:
                self._seen = True
                await self._hold(response)
            elif self.held and chunk.data.get("type") in FINAL_EVENTS:
                await self._end(response)
        return chunk

    async def _hold(self, response: dict[str, Any]) -> None:
        if response.get("status") not in UNFINISHED:
            return
        # held first: a cancellation while it is stored (shielded, it goes on) must not meter it twice
        self.held = True
        try:
            self.held = await asyncio.shield(self._on_hold(response, self._meter.prompt_tokens))
        except Exception:  # not stored: metered by this request, as far as it is relayed
            log.exception("holding background response %s failed", response.get("id"))
            self.held = False

    async def _end(self, response: dict[str, Any]) -> None:
        try:  # shielded: the client leaving while it is stored and metered does not cut that short
            await asyncio.shield(self._on_end(response, self._meter))
        except Exception:  # the database is down: still held, the follower (or a poll) finishes it
            log.exception("storing the end of background response %s failed", response.get("id"))

    def interrupt(self) -> None:
        """The stream's own ``interrupt`` (``backends.base.ChunkStream``), where it has one."""
        if (interrupt := getattr(self._chunks, "interrupt", None)) is not None:
            interrupt()

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class HeldStream(ChunkStream[Any]):
    """``stream``, its response held from its first event (``_Holding``); held, its meter is emptied
    when it is closed: the relay then settles its request at no tokens."""

    def __init__(self, stream: ChunkStream[Any], on_hold: OnHold, on_end: OnEnd) -> None:
        holding = _Holding(stream, on_hold, on_end)
        super().__init__(holding, stream.meter, stream.tokens_left, stream.tokens_reset)
        self._holding = holding

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self._holding.held:  # its spend is metered when it ends, not by this request
                spent = self.meter
                self.meter = Meter(first_token_at=spent.first_token_at, upstream_request_id=spent.upstream_request_id)
