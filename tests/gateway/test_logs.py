"""BatchedStreamHandler: the lines of one event-loop turn in one write; nothing held back for long."""

from __future__ import annotations

import asyncio
import io
import logging

from gateway.telemetry.logs import BatchedStreamHandler


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
