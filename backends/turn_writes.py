"""Requests to one upstream, written together at the end of an event-loop turn when a turn makes several.

``Turn`` is the gate this takes: the first call of a turn is told so, the others wait for its end.
The server uses it for the ends of its answers too (``gateway.cli.http_protocol``).

A request written to a sleeping upstream process wakes it; on one host (an engine or a vLLM next
to the gateway, the benchmark's upstream) that is a cross-CPU wake-up. Written one by one as the
requests of a busy turn reach the upstream client, each request can wake the upstream again,
since it has gone back to sleep by the time the next arrives; written back to back, they wake it
once. ``bench.gateway_ab --phases abc`` (8 rounds; 64 connections, the upstream on the other
CPU): 0.233 to 0.213 ms of gateway CPU per request in (a), 4,243 to 4,633 requests/s served;
(b)'s added latency and (c)'s time to first chunk as before.

The first write of a turn goes at once, so a request that is alone in its turn (a lightly loaded
gateway) is not delayed; the later ones wait at most for the rest of the turn (what the turn's
other requests still do before their own writes) and then leave in the order they were made.
A write whose connection has closed or been aborted meanwhile (the request was cancelled, the
upstream went away) is dropped, and a connection whose write raises is aborted: the exchange
waiting for its answer fails as it would have, and the turn's other requests still go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Turn:
    """One event loop's turns as a gate: ``first()`` is true for its first call in a turn and false
    for the others until the turn ends (the loop's next round of callbacks), which calls ``on_end``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_end: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self._on_end = on_end
        self._open = False

    def first(self) -> bool:
        if self._open:
            return False
        self._open = True
        self.loop.call_soon(self._end)
        return True

    def _end(self) -> None:
        self._open = False
        if self._on_end is not None:
            self._on_end()


class TurnWrites:
    """One event loop's gathered writes (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._turn = Turn(loop, self._flush)
        self._pending: list[tuple[asyncio.Transport, bytes]] = []

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        if self._turn.first():
            transport.write(data)
        else:
            self._pending.append((transport, data))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for transport, data in pending:
            try:
                if not transport.is_closing():
                    transport.write(data)
            except Exception:  # one connection's failure is not the others': its exchange fails as it goes
                transport.abort()
