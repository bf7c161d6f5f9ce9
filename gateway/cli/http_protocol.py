"""uvicorn's httptools protocol with a deadline on each request head (a slow-loris guard).

uvicorn times out idle keep-alive connections but not a client that sends its request line and
headers a byte at a time: such connections would stay open for ever. Here a connection whose
request head is not complete ``$SWITCHYARD_HEADER_TIMEOUT`` seconds (default 10) after it began
is closed. The setting travels by environment so that worker processes see it too.
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_ENV = "SWITCHYARD_HEADER_TIMEOUT"
DEFAULT_SECONDS = 10.0


class HeadDeadlineProtocol(HttpToolsProtocol):
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timeout = float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_SECONDS)
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # the next request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self._head_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        self.transport.close()
