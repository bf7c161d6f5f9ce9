"""The probe ``bench.stream_wait`` puts into the gateway process (on its ``PYTHONPATH``): the
moments of each streamed request's way to its first chunk, written as JSON when the process exits.

Python imports ``sitecustomize`` at start; with ``$STREAM_WAIT_OUT`` set, the probe installs itself
when the served worker settles its heap (``gc.freeze``, called once in the running loop after
startup) by wrapping, in place, the gateway's own functions that each moment passes through: the
client's bytes read (``HeadDeadlineProtocol.data_received``), the request's task running
(``FastRoutes.__call__``), the upstream call (``RawHTTP.open_stream``), its request written
(``TurnWrites``), the upstream's answer read (``_Connection.data_received``), the call returning,
and the response's head written with the first chunk (``CoalescedWrites``). Without the variable it
does nothing.
"""

from __future__ import annotations

import atexit
import contextvars
import gc
import json
import os
import time
from typing import Any

SEGMENTS = (
    "client's request read -> its task runs",
    "task -> upstream call (auth, quotas, routing)",
    "upstream call -> request written",
    "request written -> upstream's answer read",
    "answer read -> task resumes",
    "task resumes -> head + first chunk written",
)
_HEAD = b"HTTP/1.1 "
_samples: list[list[float]] = []
_client: contextvars.ContextVar[Any] = contextvars.ContextVar("stream_wait_client", default=None)


def install(out: str) -> None:
    """Wrap the functions in place and write the samples to ``out`` at exit."""
    from backends import raw_http, turn_writes
    from gateway import fast_routes
    from gateway.cli import http_protocol
    from gateway.event_stream import WRITE_NOW

    now = time.perf_counter
    protocol, writes = http_protocol.HeadDeadlineProtocol, http_protocol.CoalescedWrites

    def wrap(cls: type, name: str, make: Any) -> None:
        setattr(cls, name, make(getattr(cls, name)))

    def client_read(orig: Any) -> Any:
        def data_received(self: Any, data: bytes) -> None:
            if getattr(self.transport, "_sw", None) is None:  # the first read of a request
                self.transport._sw = [now()]
            orig(self, data)
        return data_received

    def task_runs(orig: Any) -> Any:
        async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
            client = scope[WRITE_NOW].args[0]().transport
            if (stamps := getattr(client, "_sw", None)) is not None:
                stamps.append(now())
                _client.set(client)
            await orig(self, scope, receive, send)
        return call

    def upstream_call(orig: Any) -> Any:
        async def open_stream(self: Any, *args: Any, **kwargs: Any) -> Any:
            client = _client.get()
            if client is not None and len(stamps := client._sw) == 2:
                stamps.append(now())
            stream = await orig(self, *args, **kwargs)
            conn = stream._conn
            if client is not None and len(stamps := client._sw) == 3 and conn._sw_read is not None:
                stamps += [conn._sw_written, conn._sw_read, now()]
            return stream
        return open_stream

    def written(conn: Any, at: float) -> None:
        conn._sw_written, conn._sw_read = at, None

    def written_at_once(orig: Any) -> Any:
        def write(self: Any, transport: Any, data: bytes) -> None:
            queued = len(self._pending)
            orig(self, transport, data)
            if len(self._pending) == queued:
                written(transport.get_protocol(), now())
        return write

    def written_at_turn_end(orig: Any) -> Any:
        def flush(self: Any) -> None:
            at = now()
            for transport, _ in self._pending:
                written(transport.get_protocol(), at)
            orig(self)
        return flush

    def answer_read(orig: Any) -> Any:
        def data_received(self: Any, data: bytes) -> None:
            if self._sw_read is None:
                self._sw_read = now()
            orig(self, data)
        return data_received

    def head_out(orig: Any) -> Any:
        def write(self: Any, *data: bytes) -> None:
            first = self._pending[0] if self._pending else data[0] if data else b""
            if (stamps := getattr(self, "_sw", None)) is not None and first[:9] == _HEAD:
                if len(stamps) == 6:
                    _samples.append([b - a for a, b in zip(stamps, [*stamps[1:], now()], strict=True)])
                self._sw = None
            orig(self, *data)
        return write

    wrap(protocol, "data_received", client_read)
    wrap(fast_routes.FastRoutes, "__call__", task_runs)
    wrap(raw_http.RawHTTP, "open_stream", upstream_call)
    wrap(turn_writes.TurnWrites, "write", written_at_once)
    wrap(turn_writes.TurnWrites, "_flush", written_at_turn_end)
    raw_http._Connection._sw_written = raw_http._Connection._sw_read = 0.0
    wrap(raw_http._Connection, "data_received", answer_read)
    wrap(writes, "flush", head_out)
    wrap(writes, "write_now", head_out)
    atexit.register(lambda: _write(out))


def _write(out: str) -> None:
    with open(out, "w") as f:
        json.dump({"segments": SEGMENTS, "samples": _samples}, f)


if out := os.environ.get("STREAM_WAIT_OUT"):
    _freeze = gc.freeze

    def _freeze_then_install() -> None:
        _freeze()
        gc.freeze = _freeze
        install(out)

    gc.freeze = _freeze_then_install
