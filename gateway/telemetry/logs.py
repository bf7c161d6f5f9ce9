"""Logs: one access line per request, and structured JSON lines on request (``telemetry.json_logs``)
with the request's id, tenant, model, status and latency when a request is in progress. Keys,
prompts and answers are never logged: the access line carries ids, counts and timings only.

A served gateway writes its ``switchyard.*`` logs through ``BatchedStreamHandler``: lines logged
in one stretch of the event loop go out in one write, from the loop's own thread, instead of a
write and a thread hand-off per line (the access line alone was about a tenth of a request's CPU).
While that handler is the only one the access logger reaches, nothing filters it and its
formatter is one of ``install_logging``'s, the access line is formatted straight into it, the same
text as through ``logging`` without a LogRecord and the handler chain (``log_access``).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
from typing import Any, TextIO

import msgspec

from gateway.telemetry.context import RequestInfo, request_info

_encoder = msgspec.json.Encoder()
ACCESS = logging.getLogger("switchyard.access")
SERVER_LOGGER = "uvicorn"  # the server's own loggers' parent


class JsonFormatter(logging.Formatter):
    uses_fields = True  # an access line carries ``access_fields``

    def format_access(self, created: float, logger: str, message: str, fields: dict[str, Any]) -> str:
        """The line ``format`` makes of an INFO record with these ``fields``, built directly."""
        return _encoder.encode(
            {"ts": round(created, 3), "level": "info", "logger": logger, "message": message, **fields}
        ).decode()

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        info = request_info()
        if info is not None:
            out["request_id"] = info.request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return _encoder.encode(out).decode()


class TextFormatter(logging.Formatter):
    """``time level logger: message``, as ``logging.Formatter`` writes it, the message's control
    characters escaped (``printable``): a path or name a client sent, which many messages quote (an
    error's "on GET /admin/v1/tenants/..."), can neither put a NUL in a line nor start a forged one.
    A traceback still follows on lines of its own. An access line ends with ``client=<address>``
    (the JSON line's ``client``) when the request has one."""

    uses_fields = False  # an access line is its message and its client alone

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second = -1  # the second whose date and time ``_stamp`` holds
        self._stamp = ""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and (client := fields.get("client")) is not None:
            line = f"{line} client={client}"
        return printable(line)

    def format_access(self, created: float, logger: str, message: str, fields: dict[str, Any]) -> str:
        """The line ``format`` makes of an INFO record created at ``created``, built directly; the
        date and time of a second are formatted once (``formatTime`` converts and formats them for
        every record)."""
        second = int(created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(created))
            self._second = second
        line = f"{self._stamp},{int((created - second) * 1000):03d} INFO {logger}: {message}"
        return line if (client := fields.get("client")) is None else f"{line} client={printable(client)}"


class BatchedStreamHandler(logging.Handler):
    """Formats each record at once; writes the lines of one event-loop turn together, within
    ``delay`` seconds. Warnings and worse, and records logged outside an event loop, are written
    at once. ``flush()`` (called by logging's shutdown, and by ``close()``) writes what is held."""

    def __init__(self, stream: TextIO | None = None, delay: float = 0.05) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.delay = delay
        self._lines: list[str] = []
        self._pending = False
        self._write_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self.add_line(line, record.levelno)

    def add_line(self, line: str, level: int = logging.INFO) -> None:
        """Hold a formatted ``line`` (ending in a newline) for the next write, or write it now."""
        with self._write_lock:
            self._lines.append(line)
        if level >= logging.WARNING:
            self.flush()
            return
        if self._pending:  # a write is already due (asking for the loop again costs a system call)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._pending = True
        loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        with self._write_lock:
            self._pending = False
            lines, self._lines = self._lines, []
            if lines:
                try:
                    self.stream.write("".join(lines))
                    self.stream.flush()
                except (OSError, ValueError):  # stderr closed at exit: nothing left to tell
                    pass

    def close(self) -> None:
        self.flush()
        super().close()


def install_logging(*, json: bool, level: int = logging.INFO) -> None:
    """The ``switchyard`` loggers write to stderr through one BatchedStreamHandler (idempotent):
    JSON lines with ``json``, else ``time level logger: message``. With ``json`` uvicorn's own lines
    (start-up, shutdown, the warning a malformed request causes) are JSON too, so that stderr holds
    JSON lines only, as a log shipper parsing them expects."""
    root = logging.getLogger("switchyard")
    if any(isinstance(h, BatchedStreamHandler) for h in root.handlers):
        return
    handler = BatchedStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    # the lines of the event loop's last turns (the server's shutdown) are written at exit: logging's
    # own flush at exit misses this handler once a dictConfig (Litestar's, as an app is made) has
    # cleared logging's list of handlers
    atexit.register(handler.flush)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    if json:  # the server's lines are few, and the last come as it exits: written at once
        server_handler = logging.StreamHandler(sys.stderr)
        server_handler.setFormatter(handler.formatter)
        server = logging.getLogger(SERVER_LOGGER)  # "uvicorn.error" writes through it; its access log is off
        server.handlers[:] = [server_handler]
        server.propagate = False


def lean_log_records() -> None:
    """Records stop collecting what no line of a served gateway shows (the logging docs'
    "Optimization"): the caller's file and line (a walk up the stack per record), the thread,
    process and process name. Process-wide, so only for a process that owns its logging."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def access_fields(info: RequestInfo, started: float) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": info.request_id, "method": info.method, "path": info.path, "status": info.status,
        "latency_ms": round((time.perf_counter() - started) * 1000, 3), "tenant_id": info.tenant_id,
        "key_id": info.key_id, "model": info.model,
    }  # fmt: skip
    for name in ("deployment", "error_type", "prompt_tokens", "completion_tokens", "upstream_request_id", "client"):
        value = getattr(info, name)
        if value is not None:
            fields[name] = value
    return fields


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x00``, ``\\n``): a client's path or name can
    neither put a NUL in a log line nor start a forged one."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def log_access(info: RequestInfo, started: float) -> None:
    if not ACCESS.isEnabledFor(logging.INFO):
        return
    handler = _direct_access_handler()
    path = printable(info.path)
    if handler is None:
        ACCESS.info("%s %s %s", info.method, path, info.status, extra={"fields": access_fields(info, started)})
        return
    formatter: JsonFormatter | TextFormatter = handler.formatter  # type: ignore[assignment]
    fields = access_fields(info, started) if formatter.uses_fields else {"client": info.client}
    message = f"{info.method} {path} {info.status}"
    handler.add_line(formatter.format_access(time.time(), ACCESS.name, message, fields) + "\n")


def _direct_access_handler() -> BatchedStreamHandler | None:
    """The handler an access record would reach, when it is the only one, nothing filters on the
    way and its formatter is one of ours; else None (the line goes through ``logging``)."""
    parent = ACCESS.parent
    if ACCESS.handlers or ACCESS.filters or ACCESS.disabled or not ACCESS.propagate or parent is None:
        return None
    if parent.filters or parent.propagate or len(parent.handlers) != 1:
        return None
    handler = parent.handlers[0]
    if type(handler) is not BatchedStreamHandler or handler.filters or handler.level > logging.INFO:
        return None
    return handler if type(handler.formatter) in (JsonFormatter, TextFormatter) else None
