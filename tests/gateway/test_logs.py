"""BatchedStreamHandler: the lines of one event-loop turn in one write; nothing held back for long;
the access line formatted straight into it is the line logging writes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gateway.telemetry.context import RequestInfo
from gateway.telemetry.logs import ACCESS, BatchedStreamHandler, JsonFormatter, TextFormatter, log_access


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _logger(stream: CountingStream, delay: float = 0.02) -> logging.Logger:
    log = logging.getLogger(f"switchyard.test-batched-{id(stream)}")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = BatchedStreamHandler(stream, delay=delay)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


async def test_lines_of_one_turn_go_out_in_one_write_and_warnings_at_once() -> None:
    stream = CountingStream()
    log = _logger(stream)
    for i in range(100):
        log.info("access %d", i)
    assert stream.getvalue() == ""  # held for at most the delay
    await asyncio.sleep(0.05)
    assert stream.writes == 1 and stream.getvalue().count("\n") == 100
    log.info("before")
    log.warning("now")  # a warning is written at once, with what was held before it
    assert stream.getvalue().endswith("INFO before\nWARNING now\n") and stream.writes == 2


def test_outside_an_event_loop_lines_are_written_at_once() -> None:
    stream = CountingStream()
    _logger(stream).info("from a thread or a script")
    assert stream.getvalue() == "INFO from a thread or a script\n"


async def test_close_flushes_what_is_held() -> None:
    stream = CountingStream()
    log = _logger(stream, delay=60)
    log.info("last words")
    for handler in log.handlers:
        handler.close()
    assert stream.getvalue() == "INFO last words\n"


class _PassAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return True  # lets everything through; its presence alone sends access lines through logging


@contextmanager
def the_only_handler(formatter: logging.Formatter) -> Iterator[tuple[CountingStream, BatchedStreamHandler]]:
    """The gateway's loggers writing through one BatchedStreamHandler with ``formatter`` (as
    ``install_logging`` sets them up), into the stream yielded; put back as they were after."""
    parent = logging.getLogger("switchyard")
    saved = (parent.handlers[:], parent.propagate, parent.level)
    stream = CountingStream()
    handler = BatchedStreamHandler(stream)
    handler.setFormatter(formatter)
    parent.handlers[:] = [handler]
    parent.propagate, parent.level = False, logging.INFO
    try:
        yield stream, handler
    finally:
        parent.handlers[:], parent.propagate, parent.level = saved


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_the_direct_access_line_is_the_line_logging_writes(formatter: logging.Formatter,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """log_access formats straight into the handler while nothing else could see the record; the
    line is the one the logging path writes (same clock), and a filter anywhere sends it through
    logging again."""
    now = 1_780_000_000.123456
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setattr(time, "time_ns", lambda: int(now * 1e9))
    monkeypatch.setattr(time, "perf_counter", lambda: 10.5)
    info = RequestInfo("req-1", "POST", "/v1/chat/completions", tenant_id="t-1", key_id="k-1", model="fast",
                       deployment="fast#0", status=200, prompt_tokens=12, completion_tokens=3)
    emitted: list[logging.LogRecord] = []
    with the_only_handler(formatter) as (stream, handler):
        handler.handle = lambda record: bool(emitted.append(record)) or logging.Handler.handle(handler, record)  # type: ignore[method-assign]
        log_access(info, 10.25)
        assert not emitted  # no LogRecord was made
        ACCESS.addFilter(_PassAll())
        try:
            log_access(info, 10.25)
        finally:
            ACCESS.filters.clear()
        assert len(emitted) == 1
    direct, through_logging = stream.getvalue().splitlines()
    assert direct == through_logging
    if isinstance(formatter, JsonFormatter):
        line = json.loads(direct)
        assert line["latency_ms"] == 250.0 and line["message"] == "POST /v1/chat/completions 200"
    else:
        assert direct.endswith(" INFO switchyard.access: POST /v1/chat/completions 200")


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_control_characters_in_a_path_are_escaped_in_the_access_line(formatter: logging.Formatter) -> None:
    """A path with %00 or %0a (decoded by the server) cannot write a NUL or start a forged line."""
    with the_only_handler(formatter) as (stream, _):
        log_access(RequestInfo("req-1", "GET", "/admin/v1/tenants/a\x00b\nINFO forged", status=400), 0.0)
    written = stream.getvalue()
    assert "\x00" not in written and written.count("\n") == 1
    line = written.rstrip("\n")
    message = json.loads(line)["message"] if isinstance(formatter, JsonFormatter) else line
    assert message.endswith("GET /admin/v1/tenants/a\\x00b\\nINFO forged 400")


def test_a_text_access_line_has_the_time_logging_gives_each_record() -> None:
    """TextFormatter formats a second's date and time once: lines within a second, across a second's
    end and after a gap still carry the time ``formatTime`` gives each record, milliseconds included."""
    formatter = TextFormatter()
    base = 1_780_000_000.0
    for created in (base + 0.0004, base + 0.5, base + 0.9996, base + 1.0, base + 1.001, base + 3600.25, base + 0.75):
        record = logging.LogRecord("switchyard.access", logging.INFO, __file__, 1, "GET /x 200", None, None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert formatter.format_access(created, "switchyard.access", "GET /x 200", {}) == formatter.format(record)
