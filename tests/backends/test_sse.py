"""SSELines reads the events of an upstream's body as they arrive, in whatever pieces they come."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.base import BackendError, BadRequest, RateLimited, Unavailable, UpstreamError
from backends.raw_stream import MAX_LINE, RawStream
from backends.sse import WAIT, SSELines


class _Conn:
    transport: Any = None
    _stream: Any = None

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Pool:
    def __init__(self) -> None:
        self.released: list[Any] = []

    def _release(self, conn: Any) -> None:
        self.released.append(conn)


def body_stream() -> RawStream:
    slots = asyncio.Semaphore(1)
    slots._value = 0  # held by the stream, as ``RawHTTP.open_stream`` holds it
    return RawStream(_Conn(), _Pool(), slots)  # type: ignore[arg-type]


async def test_events_come_whole_however_the_body_is_cut() -> None:
    stream = body_stream()
    lines = SSELines(stream, idle=60)
    pieces = [
        b": a comment, then a keep-alive\n\nevent: message\ndata: {\"a\":1}\n\ndata: {\"b\"",  # 1.5 events
        b":2}\r\n\r\n",  # the rest of one, with CRLF endings
        b"data: {\"c\":3}\n\ndata: {\"d\":4}\n\n",  # two in one piece
        b"data: [DONE]\n\ndata: {\"after\":5}\n\n",  # what follows [DONE] is not an event
    ]
    got: list[bytes] = []
    deadline = asyncio.get_running_loop().time() + 10
    stream.feed(pieces[0])
    got.append(await lines.next(deadline))  # type: ignore[arg-type]
    assert lines.poll() is WAIT  # half an event is not one
    for piece in pieces[1:]:
        stream.feed(piece)
    stream.end()
    while (data := await lines.next(deadline)) is not None:
        got.append(data)
    assert got == [b'{"a":1}', b'{"b":2}', b'{"c":3}', b'{"d":4}']
    assert lines.poll() is None


async def test_a_last_event_without_a_newline_still_counts_at_the_end() -> None:
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(b"data: {\"a\":1}\n\ndata: {\"b\":2}")
    stream.end()
    deadline = asyncio.get_running_loop().time() + 10
    assert [await lines.next(deadline), await lines.next(deadline), await lines.next(deadline)] == [
        b'{"a":1}', b'{"b":2}', None]


async def test_a_byte_order_mark_before_the_first_event_is_ignored() -> None:
    """The SSE standard skips one leading U+FEFF: the first event behind it is an event, not lost."""
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(b"\xef\xbb\xbfdata: {\"a\":1}\n\ndata: {\"b\":2}\n\n\xef\xbb\xbfdata: {\"c\":3}\n\n")
    stream.end()
    deadline = asyncio.get_running_loop().time() + 10
    assert [await lines.next(deadline), await lines.next(deadline), await lines.next(deadline)] == [
        b'{"a":1}', b'{"b":2}', None]  # a mark later on is no part of the standard: that line is no data line


async def test_an_events_data_lines_are_one_event_on_one_line() -> None:
    """Several ``data:`` lines are one event (a JSON object may be cut across them), joined on one
    line (relayed as it came, it stays one ``data:`` line); it is whole at its blank line, however
    the body is cut, and at the end of the body without one."""
    stream = body_stream()
    lines = SSELines(stream)
    deadline = asyncio.get_running_loop().time() + 10
    stream.feed(b'data: {"a":\r\nid: 7\r\ndata: 1}\r\n')
    assert lines.poll() is WAIT  # its blank line has not come
    stream.feed(b'\r\ndata: [1,\ndata: 2]\n\ndata: {"b":\ndata: 2}')
    stream.end()
    assert [await lines.next(deadline) for _ in range(4)] == [b'{"a": 1}', b"[1, 2]", b'{"b": 2}', None]


async def test_lines_ended_by_a_carriage_return_alone_come_as_they_arrive() -> None:
    """The SSE standard ends a line with CRLF, LF or CR alone: CR-ended events come as each arrives,
    not at the end of the body; a CRLF cut between its CR and its LF is one line end."""
    stream = body_stream()
    lines = SSELines(stream)
    deadline = asyncio.get_running_loop().time() + 10
    stream.feed(b'data: {"a":1}\r\r')
    assert await asyncio.wait_for(lines.next(deadline), 1) == b'{"a":1}'
    stream.feed(b'data: {"b":\r')  # its LF, or a blank line, may still come
    assert lines.poll() is WAIT
    stream.feed(b'\ndata: 2}\r\n\r')  # a blank line: whether an LF follows its CR or not
    assert lines.poll() == b'{"b": 2}'
    stream.feed(b'\ndata: {"c":3}\r\r')
    assert [lines.poll(), lines.poll()] == [b'{"c":3}', WAIT]
    stream.feed(b"data: [DONE]\r\r")
    stream.end()
    assert await lines.next(deadline) is None and lines.saw_done


@pytest.mark.parametrize(("event", "error"), [
    (b'{"error": {"message": "slow down", "type": "rate_limit_error"}}', RateLimited),
    (b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}', Unavailable),
    (b'{"error": {"message": "no", "type": "BadRequestError", "param": "n", "code": 400}}', BadRequest),
    (b'{"error": {"message": "something odd"}}', UpstreamError),
    (b'{"error": "a bare string"}', UpstreamError),
])
async def test_a_first_event_that_is_an_error_raises_its_typed_error(event: bytes,
                                                                    error: type[BackendError]) -> None:
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(b"data: " + event + b"\n\n")
    with pytest.raises(error) as raised:
        await lines.next(asyncio.get_running_loop().time() + 10)
    assert type(raised.value) is error


@pytest.mark.parametrize(("body", "error"), [
    (b'{\n  "error": {"message": "The model is overloaded", "type": "server_error", "code": 503}\n}\n', Unavailable),
    (b'{"error": {"message": "slow down", "code": "rate_limit_exceeded"}}', RateLimited),  # no newline at its end
])
async def test_a_body_that_is_a_whole_error_object_raises_its_typed_error(body: bytes,
                                                                          error: type[BackendError]) -> None:
    """A 2xx answer to a stream request that is one JSON error object, not events, fails as the error it
    names (as such a whole answer's body does), so the router may try another deployment."""
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(body[:10])
    assert lines.poll() is WAIT
    stream.feed(body[10:])
    stream.end()
    with pytest.raises(error, match="overloaded|slow down") as raised:
        await lines.next(asyncio.get_running_loop().time() + 10)
    assert type(raised.value) is error


async def test_a_body_without_events_or_an_error_object_just_ends() -> None:
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(b'{"id": "x", "choices": []}\n: a comment\n\n')
    stream.end()
    assert await lines.next(asyncio.get_running_loop().time() + 10) is None


async def test_an_error_event_after_the_first_is_data_for_the_caller() -> None:
    stream = body_stream()
    lines = SSELines(stream)
    later = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'
    stream.feed(b'data: {"a":1}\n\ndata: ' + later + b"\n\n")
    deadline = asyncio.get_running_loop().time() + 10
    assert [await lines.next(deadline), await lines.next(deadline)] == [b'{"a":1}', later]


async def test_an_endless_line_is_an_error() -> None:
    stream = body_stream()
    lines = SSELines(stream)
    stream.feed(b"data: " + b"x" * MAX_LINE)
    with pytest.raises(UpstreamError, match="oversized"):
        await lines.next(asyncio.get_running_loop().time() + 10)


async def test_what_follows_done_is_drained_in_the_background_for_half_a_second_at_most() -> None:
    """``[DONE]`` ends the events at once; closed, the stream reads its body on in the background
    so the connection can be reused, and gives up one that does not end within the drain time
    (its connection closed)."""
    loop = asyncio.get_running_loop()
    ended, endless = body_stream(), body_stream()
    for stream in (ended, endless):
        stream.feed(b"data: {\"a\":1}\n\ndata: [DONE]\n\n")
    for stream in (ended, endless):
        lines = SSELines(stream)
        started = loop.time()
        assert [await lines.next(started + 10), await lines.next(started + 10)] == [b'{"a":1}', None]
        assert loop.time() - started < 0.05
        stream.close()
    ended.feed(b": trailing\n\n" * 1000)
    ended.end()
    assert ended._client.released == [ended._conn] and not ended._conn.closed  # type: ignore[attr-defined]
    await asyncio.sleep(0.3)
    endless.feed(b": more\n\n")
    assert not endless._conn.closed and not endless._buffer  # type: ignore[attr-defined]
    await asyncio.sleep(0.3)
    assert endless._conn.closed and endless._client.released == []  # type: ignore[attr-defined]
    assert all(stream._slots._value == 1 for stream in (ended, endless))  # each freed its slot
