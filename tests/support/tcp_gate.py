"""A TCP proxy on loopback that a test can turn into a black hole: the server behind it seems to
stop answering (a network partition, a host gone), not to refuse."""

from __future__ import annotations

import asyncio
import contextlib


class TcpGate:
    """Forwards each connection to ``host:port`` while open. ``black_hole`` drops the connections
    forwarded so far and holds each new one silent (its client waits for its own timeout);
    ``reopen`` closes those held and forwards again."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.open = True
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.StreamWriter] = set()  # every client-side and server-side stream
        self._held: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        """Listen on a free loopback port; return it."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def black_hole(self) -> None:
        self.open = False
        for writer in list(self._live):
            writer.transport.abort()

    def reopen(self) -> None:
        self.open = True
        for writer in list(self._held):
            writer.transport.abort()

    async def aclose(self) -> None:
        self.black_hole()
        self.reopen()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            self._held.add(writer)
            with contextlib.suppress(ConnectionError):
                await reader.read()  # until the client gives up, or reopen closes it
            self._held.discard(writer)
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self._live |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._live -= {writer, up_writer}
            writer.transport.abort()
            up_writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
