"""The ``data:`` payloads of an upstream's server-sent-events body, within deadlines.

Read one at a time by a task (``next``), or inside the connection's callback as each piece of the
body arrives (``poll`` from a ``RawStream.wait`` listener): both read the same lines the same way,
so a relay can change between them at any event. An event ends at a blank line (or the end of the
body); its data is its ``data:`` lines joined (a JSON object cut across them is whole, as the SSE
standard and the openai SDK read it), by a space rather than the standard's newline, so that an
event relayed as it came stays one ``data:`` line. A first event that is an ``{"error": {...}}``
object is the upstream failing the request before its answer began: it raises as the typed error
its content names (``backends.http_upstream.event_error``), so the router can retry it as it does
an error status; an error event after that is the caller's to read. So does a body that ends before
any event and is one whole ``{"error": {...}}`` object (a 2xx error answer, not a stream), as a
whole answer's body does. ``[DONE]`` ends the events at once: what may follow it, up to the end of
the body, is read on in the background once the stream is closed (``RawStream.linger``), so that
neither the client's end nor the settlement waits for it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from backends.base import Timeout, Unavailable, UpstreamError
from backends.http_upstream import BOM, raise_if_error
from backends.raw_stream import RawStream

_DRAIN_SECONDS = 0.5  # after [DONE], how long the body is read on in the background, for its end
_OPENING = 64 << 10  # the bytes of a body before its first event kept, to read an error object sent instead


class _Wait:
    """``SSELines.poll``'s answer when no whole event has arrived yet."""


WAIT: Final = _Wait()


class SSELines:
    """The ``data:`` payloads of a server-sent-events body, one at a time, within deadlines: each
    ``next`` by the deadline it is given, and after the first event every line within ``idle``.

    A deadline is one timer per stream, not a timeout scope per line: a line only notes its time, and
    the timer, when it fires early for the idle limit, moves itself to the last line's time + idle.
    When a limit is reached the pending read fails. ``close()`` drops the timer (the end of the body
    and any failure do too)."""

    def __init__(self, stream: RawStream, idle: float | None = None) -> None:
        self._loop = stream.loop  # not asyncio.get_running_loop(): a getpid system call each on Python 3.11
        self._content = stream
        self._idle = idle
        self._started = False  # an event arrived: from now on silences are bounded by ``idle``
        self._fresh = True  # no line read yet: a byte order mark may lead the body
        self._done = False  # ``[DONE]`` came: the events are over (once those in _events are read)
        self._events: deque[bytes] = deque()  # data of events read but not yet returned
        self._opening = b""  # the body read before the first event (its first _OPENING bytes)
        self._data: bytes | None = None  # the data lines of an event whose closing blank line has not come
        self._last = 0.0  # loop time of the last line read
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._expired: str | None = None  # why the timer failed the read: "idle" or "deadline"
        self._idle_armed = False  # the timer also watches the idle limit

    @property
    def content(self) -> RawStream:
        return self._content

    @property
    def saw_done(self) -> bool:
        """``[DONE]`` came (not merely the end of the body)."""
        return self._done

    async def next(self, deadline: float) -> bytes | None:
        """The next event's data (its bytes as sent), or None at ``[DONE]`` / the end of the body."""
        self.arm(deadline)
        try:
            while (data := self.poll()) is WAIT:
                await self._content.wait()
        except BaseException:
            self.close()
            raise
        if data is None:
            self.close()
        return data  # type: ignore[return-value]  # not WAIT

    def arm(self, deadline: float) -> None:
        """Bound the reads from now on by ``deadline`` (and ``idle``, once an event has come)."""
        if self._timer is None or self._deadline != deadline or self._idle_unarmed():
            self._deadline = deadline
            self._arm()

    def poll(self) -> bytes | None | _Wait:
        """``next`` without waiting: the next event's data if it has arrived whole, None at the end,
        else ``WAIT``. Failures raise as they do from ``next``. The lines that have arrived are
        read together, and their events kept for the next calls."""
        if self._events:
            return self._events.popleft()
        if self._done:
            return None
        try:
            while (lines := self._content.lines_nowait()) is not None:
                self._last = self._loop.time()
                if self._fresh:  # the standard ignores one leading byte order mark
                    self._fresh = False
                    lines = lines.removeprefix(BOM)
                if not self._started and len(self._opening) < _OPENING:
                    self._opening += lines[:_OPENING - len(self._opening)]
                data = self._data
                # at the end of the body, a blank line: a last event not yet closed by one still counts
                for line in lines.splitlines() if lines else (b"",):
                    if line.startswith(b"data:"):  # skip event names, ids, comments, keep-alives
                        data = line[5:].strip() if data is None else data + b" " + line[5:].strip()
                    elif not line and data is not None:  # a blank line ends the event
                        if data == b"[DONE]":  # what follows it is drained (on close), not read
                            self._done = True
                            self._content.linger(_DRAIN_SECONDS)
                            data = None
                            break
                        if not self._started:
                            raise_if_error(data)
                        self._started = True
                        self._events.append(data)
                        data = None
                self._data = data
                if self._events:
                    return self._events.popleft()
                if self._done or not lines:
                    if not self._started:  # no event came: the body may be a whole error answer
                        raise_if_error(self._opening)
                    return None
        except (TimeoutError, OSError) as exc:
            self.close()
            if self._expired == "idle":
                raise Timeout(f"the upstream's stream was silent for {self._idle:g} s "
                              "(idle timeout)") from None
            if self._expired or isinstance(exc, TimeoutError):
                raise Timeout("the upstream's stream timed out") from None
            raise Unavailable(f"the upstream's stream broke: {type(exc).__name__}") from None
        except ValueError as exc:  # a line longer than the read buffer
            self.close()
            raise UpstreamError(f"the upstream sent an oversized event: {exc}") from None
        return WAIT

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> tuple[float, str]:
        if self._started and self._idle is not None and self._last + self._idle < self._deadline:
            return self._last + self._idle, "idle"
        return self._deadline, "deadline"

    def _idle_unarmed(self) -> bool:
        """The first event has come, but the timer still waits only for the deadline."""
        return self._started and self._idle is not None and not self._idle_armed

    def _arm(self) -> None:
        self.close()
        at, _ = self._due()
        self._idle_armed = self._started and self._idle is not None
        self._timer = self._loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._timer = None
        at, why = self._due()
        if self._loop.time() < at:  # lines came since it was set: wait for the new limit
            self._timer = self._loop.call_at(at, self._expire)
            return
        self._expired = why
        self._content.set_exception(TimeoutError())
