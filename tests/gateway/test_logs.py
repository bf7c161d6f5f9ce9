"""BatchedStreamHandler: the lines of one event-loop turn in one write; nothing held back for long;
the access line formatted straight into it is the line logging writes; no text line can be forged."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.db import migrate
from gateway.telemetry.context import RequestInfo
from gateway.telemetry.logs import ACCESS, BatchedStreamHandler, JsonFormatter, TextFormatter, log_access
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.fake_upstream import FakeUpstream


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
                       deployment="fast#0", status=200, prompt_tokens=12, completion_tokens=3,
                       client="198.51.100.9")
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
        assert line["client"] == "198.51.100.9"
    else:
        assert direct.endswith(" INFO switchyard.access: POST /v1/chat/completions 200 client=198.51.100.9")


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


def test_a_text_line_quoting_a_clients_path_escapes_its_control_characters() -> None:
    """Any message, not only the access line: an error's "on GET <path>" with a %0a in the path
    stays one line (its traceback still follows on lines of its own)."""
    formatter = TextFormatter()
    path = "/admin/v1/tenants/a\x00b\n2026-12-07 09:00:00,000 CRITICAL switchyard.auth: forged"
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("switchyard.errors", logging.ERROR, __file__, 1, "unhandled error on %s %s",
                                   ("GET", path), sys.exc_info())
    first, *traceback = formatter.format(record).split("\n")
    assert first.endswith(r"unhandled error on GET /admin/v1/tenants/a\x00b\n2026-12-07 09:00:00,000 CRITICAL "
                          "switchyard.auth: forged")
    assert "\x00" not in first and traceback[0] == "Traceback (most recent call last):"
    assert not any("forged" in line for line in traceback)


def test_a_served_error_on_a_path_with_a_newline_writes_no_forged_line(fake_upstream_server: FakeUpstream,
                                                                      start_gateway: Any, tmp_path: Path) -> None:
    """A 500 on a path a client chose (here a database file gone bad) logs the path as one line."""
    db = tmp_path / "gateway.db"
    migrate.upgrade(f"sqlite+aiosqlite:///{db}")
    server = start_gateway(gateway_settings(fake_upstream_server.url, database={"url": f"sqlite+aiosqlite:///{db}"},
                                            usage={"journal_dir": str(tmp_path / "journal")}))
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(server.url + "/admin/v1/tenants", headers=admin).status_code == 200
    db.write_bytes(b"not a database" * 4096)
    with the_only_handler(TextFormatter()) as (stream, handler):
        answer = httpx.get(server.url + "/admin/v1/tenants/t%0A2026-12-07 09:00:00,000 CRITICAL x: forged",
                           headers=admin)
        handler.flush()
    assert answer.status_code == 500
    lines = stream.getvalue().splitlines()
    assert any(line.endswith(r"GET /admin/v1/tenants/t\n2026-12-07 09:00:00,000 CRITICAL x: forged") for line in lines)
    assert not any(line.startswith("2026-12-07 09:00:00,000") for line in lines)


def test_lines_of_the_loops_last_turn_are_written_at_exit(tmp_path: Path) -> None:
    """Logging's flush at exit missed the handler once a Litestar app was made (its dictConfig clears
    logging's list of handlers): a line logged as the event loop ended was never written."""
    script = tmp_path / "last_words.py"
    script.write_text(
        "import asyncio, logging\n"
        "from litestar import Litestar\n"
        "from gateway.telemetry.logs import install_logging\n"
        "install_logging(json=False)\n"
        "Litestar()\n"
        "async def main() -> None:\n"
        "    logging.getLogger('switchyard.test').info('last words')\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(" INFO switchyard.test: last words\n")
