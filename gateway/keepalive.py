"""Keep-alives on relayed streams gone silent (``server.stream_keepalive_seconds``).

Proxies and load balancers between a client and the gateway cut a connection on which nothing came
for a while (nginx's ``proxy_read_timeout``, an AWS ALB's idle timeout: 60 s by default); a stream
whose upstream is silent (a reasoning model thinking, a request waiting its turn in an engine) would
be cut so, and its client lose the answer. The upstream's own keep-alive comments do not pass the
gateway's SSE reader.

One timer per app (``KeepAlives``, the pipeline's) visits the streams being relayed every
``seconds``: a stream that wrote its client nothing since the previous visit is written a
keep-alive its client's SDK ignores (``SSERelay``: an SSE comment, or Anthropic's ``ping`` event),
and one that wrote something has its mark cleared. A stream silent for ``seconds`` so gets its first
keep-alive after between 1x and 2x ``seconds`` of silence, then one every ``seconds`` while the
silence lasts. A stream costs a set add and discard, a chunk the store of its mark (no clock read);
the timer runs only while streams are relayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("switchyard.keepalive")

Beat = Callable[[], None]  # a relayed stream's visit: writes a keep-alive if it wrote nothing since the last


class KeepAlives:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._beats: set[Beat] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, beat: Beat) -> None:
        """Visit ``beat`` every ``seconds`` from now until it is discarded (in the serving loop)."""
        self._beats.add(beat)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.seconds, self._visit)

    def discard(self, beat: Beat) -> None:
        self._beats.discard(beat)

    def _visit(self) -> None:
        self._timer = None
        for beat in tuple(self._beats):
            try:
                beat()
            except Exception:  # one stream's failure must not end the others' keep-alives
                log.exception("writing a keep-alive failed")
        if self._beats:
            self._timer = asyncio.get_running_loop().call_later(self.seconds, self._visit)

    def close(self) -> None:
        """Stop the timer (the app shuts down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._beats.clear()
