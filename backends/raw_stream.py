"""A streamed answer's body, as ``backends.raw_http``'s connection receives it: read in whole lines
(what a server-sent-events reader needs) or as it comes, with backpressure on the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

MAX_LINE = 32 << 20  # a streamed line (an SSE event) longer than this is an error
_HIGH_WATER = 4 << 20  # unread bytes beyond which the connection stops reading (but for a line still coming)


class _Connection(Protocol):
    """What a stream uses of ``backends.raw_http``'s connection (which imports this module)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    _stream: Any

    def close(self) -> None: ...


class _Pool(Protocol):
    def _release(self, conn: Any) -> None: ...


class RawStream:
    """A streamed answer: ``status`` and ``headers``, then the body as it arrives, read in whole
    lines (``lines_nowait``, then ``wait``) or as it comes (``readany``). Reading stops
    (``pause_reading``) while more than ``_HIGH_WATER`` bytes wait unread, unless they end in a line
    still coming (an event of megabytes: a base64 image, a long prompt's logprobs). ``set_exception``
    makes the next read raise it (a deadline); ``close`` hands a finished answer's connection back, else
    aborts it, but for one whose rest is not wanted (``linger``: what follows an SSE ``[DONE]``), read
    on and dropped in the background until it ends (then handed back) or the lingering time runs out
    (then aborted). With ``wait(listener)`` the body is read inside the connection's own callbacks,
    as it arrives."""

    def __init__(self, conn: _Connection, client: _Pool, slots: asyncio.Semaphore) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn, self._client, self._slots = conn, client, slots
        self.loop = conn.loop
        self._buffer = bytearray()
        self._after_cr = False  # the last lines read ended with a CR: an LF that comes next ends no line
        self._scanned = 0  # the buffer's first bytes that hold no line end (searched already)
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._listener: Callable[[], bool] | None = None
        self._paused = False
        self._closed = False
        self._linger: float | None = None  # ``linger``'s time: the rest of the body is not wanted
        self._lingering: asyncio.TimerHandle | None = None  # closed, and reading on to the body's end

    # ------------------------------------------------------------ fed by the connection

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        if (listener := self._listener) is not None:
            if listener():
                return
            self._listener = None  # it has had its last call: the rest is the waiting task's
        self._wake()

    def end(self) -> None:
        self._eof = True
        if self._lingering is not None:
            self._buffer.clear()
            self._finish()
            return
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        if self._exc is None and not self._eof:
            self._exc = exc
            if self._lingering is not None:
                self._finish()
                return
            self._wake()

    # ------------------------------------------------------------ read by the caller

    def lines_nowait(self) -> bytes | None:
        """Every whole line that has arrived, with their line ends (CRLF, LF, or CR alone, as server-sent
        events may end theirs; at the end, what is left: b"" when nothing is); None when no whole line
        has arrived yet (``wait`` for more)."""
        if self._exc is not None:
            raise self._exc
        if self._after_cr and self._buffer:  # the LF of a CRLF cut after its CR ends no line of its own
            self._after_cr = False
            self._buffer = self._buffer.removeprefix(b"\n")
        if (newline := self._buffer.rfind(b"\n", self._scanned)) >= 0:
            return self._take(newline + 1)
        if (cr := self._buffer.rfind(b"\r", self._scanned)) >= 0:  # lines ended by CR alone (or a CRLF cut in two)
            self._after_cr = cr == len(self._buffer) - 1
            return self._take(cr + 1)
        if self._eof:
            return self._take(len(self._buffer))
        if len(self._buffer) > MAX_LINE:
            raise ValueError(f"a line longer than {MAX_LINE} bytes")
        self._scanned = len(self._buffer)  # a long line is searched once, not again at each read
        if self._paused:  # a line longer than the high water: read on until it is whole
            self._resume()
        return None

    async def readany(self) -> bytes:
        """Whatever has arrived (waiting for something); b"" at the end."""
        while not self._buffer and not self._eof:
            if self._exc is not None:
                raise self._exc
            await self.wait()
        return self._take(len(self._buffer))

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def linger(self, seconds: float) -> None:
        """The rest of the body is not wanted, but the connection is: ``close`` reads it on in the
        background, dropping it, for up to ``seconds``."""
        self._linger = seconds

    def close(self) -> None:
        """Idempotent. A finished answer's connection goes back to the pool; an unfinished one is
        aborted, so the upstream sees the caller go (after ``linger``: once it ends, or its time is out)."""
        if self._closed:
            return
        self._closed = True
        if self._linger is not None and self._exc is None:
            self._buffer.clear()
            if not self._eof:
                self._listener = self._drop
                self._lingering = self.loop.call_later(self._linger, self._finish)
                if self._paused:
                    self._resume()
                return
        self._finish()

    def _drop(self) -> bool:
        """A lingering stream's listener: what arrives is dropped."""
        self._buffer.clear()
        return True

    def _finish(self) -> None:
        """The connection back to the pool if the answer ended whole, else aborted; the slot freed."""
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = self._listener = None
        self._conn._stream = None
        if self.at_eof() and self._exc is None:
            self._client._release(self._conn)
        else:
            self._conn.close()
        self._slots.release()

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._scanned = 0
        if self._paused and len(self._buffer) <= _HIGH_WATER // 2:
            self._resume()
        return data

    def _resume(self) -> None:
        if self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()

    async def wait(self, listener: Callable[[], bool] | None = None) -> None:
        """Until more of the body arrives, it ends or fails. With ``listener``: until it ends or
        fails, or ``listener`` returns False; it is called, from the connection's callbacks,
        each time more arrives (to read it at once, with no task switch)."""
        self._waiter = self.loop.create_future()
        self._listener = listener
        try:
            await self._waiter
        finally:
            self._waiter = self._listener = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
