"""A background response streamed (``background: true``, ``stream: true``) whose stream ends, for
the gateway, before its last event: the client went away, the drain cut it, or its connection to the
upstream broke. The upstream runs it on (a client may resume its stream there), so it is held as one
answered ``queued`` is (``gateway.held_usage``): ``on_cut`` stores it with its spend ``unsettled``,
and the request that started it settles at no tokens. One whose last event came was metered by its
stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from backends.base import ChunkStream, Meter
from backends.responses_wire import ResponsesEvent
from gateway.held_responses import UNFINISHED

# Gets the response as its stream last told it, and its prompt's estimate; says whether it is now held.
OnCut = Callable[[dict[str, Any], int], Awaitable[bool]]


async def held_if_cut(opened: Awaitable[ChunkStream[Any]], on_cut: OnCut) -> ChunkStream[Any]:
    """The stream ``opened`` gives, handed to ``on_cut`` if it is closed before its response ends."""
    return HeldStream(await opened, on_cut)


class _Watched:
    """A stream's events, as they pass; ``response``: the last response object one carried."""

    def __init__(self, chunks: AsyncIterator[Any]) -> None:
        self._chunks = chunks
        self.response: dict[str, Any] | None = None

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        chunk = await self._chunks.__anext__()
        if isinstance(chunk, ResponsesEvent) and isinstance(response := chunk.data.get("response"), dict):
            self.response = response
        return chunk

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class HeldStream(ChunkStream[Any]):
    """``stream``, but closed while its response still runs (``UNFINISHED``), it is handed to
    ``on_cut``, and, held so, its meter is emptied: the relay then settles its request at no tokens."""

    def __init__(self, stream: ChunkStream[Any], on_cut: OnCut) -> None:
        watched = _Watched(stream.chunks)
        super().__init__(watched, stream.meter, stream.tokens_left, stream.tokens_reset)
        self._watched = watched
        self._on_cut: OnCut | None = on_cut

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self._hold()

    async def _hold(self) -> None:
        response, on_cut = self._watched.response, self._on_cut
        self._on_cut = None  # once
        if on_cut is None or response is None or response.get("status") not in UNFINISHED:
            return
        spent = self.meter
        # emptied first: a cancellation while it is stored (shielded, it goes on) must not meter it twice
        self.meter = Meter(first_token_at=spent.first_token_at, upstream_request_id=spent.upstream_request_id)
        if not await asyncio.shield(on_cut(response, spent.prompt_tokens)):
            self.meter = spent  # not held: metered as far as it was relayed
