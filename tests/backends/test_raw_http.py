"""backends.raw_http against a real loopback server that answers each request with prepared bytes."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest

from backends.raw_http import MAX_HEAD, STALE_CLOSE, ProtocolError, RawHTTP
from backends.raw_stream import RawStream


class Server:
    """Reads each request (head + content-length body) and writes the next prepared answer."""

    def __init__(self) -> None:
        self.answers: list[bytes | tuple[bytes, float, bytes]] = []  # a tuple: bytes, a pause, the rest
        self.requests: list[bytes] = []
        self.connections = 0
        self.disconnected = asyncio.Event()
        self.close_after_answer = False
        self.closing: list[bytes] = []  # answers after which the connection is closed
        self.close_unanswered_after = 0.0  # seconds an answerless close (an empty answer) comes after its request
        self.hang = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                if self.hang:
                    await reader.read()  # until the client goes
                    break
                reply, pause, rest = self.answers.pop(0), 0.0, b""
                if isinstance(reply, tuple):
                    reply, pause, rest = reply
                if not reply:  # closed unanswered, as an upstream closes an idle connection as a request comes
                    await asyncio.sleep(self.close_unanswered_after)
                    break
                writer.write(reply)
                await writer.drain()
                if rest:
                    await asyncio.sleep(pause)
                    writer.write(rest)
                    await writer.drain()
                if self.close_after_answer or reply in self.closing:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.disconnected.set()
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, str]]:
    s = Server()
    srv = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    yield s, f"http://127.0.0.1:{port}/v1"
    srv.close()


def answer(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_keep_alive_headers_and_path(server: tuple[Server, str]) -> None:
    s, base = server
    s.answers = [answer(b'{"a":1}'), answer(b'{"a":2}', "x-thing: yes")]
    client = RawHTTP(base, {"authorization": "Bearer sk-up"}, connect_timeout=2)
    first = await client.post("/chat/completions", b'{"q":1}')
    second = await client.post("/chat/completions", b'{"q":2}', {"x-tenant": "t1"})
    client.close()
    assert (first.status, first.body, second.body, second.headers["x-thing"]) == (200, b'{"a":1}', b'{"a":2}', "yes")
    assert s.connections == 1  # kept alive
    head = s.requests[1].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    for line in ("authorization: Bearer sk-up", "x-tenant: t1", "content-type: application/json", "host: 127.0.0.1:"):
        assert line in head
    assert head.endswith('{"q":2}')


async def test_requests_of_one_turn_each_reach_the_upstream_whole(server: tuple[Server, str]) -> None:
    s, base = server
    s.answers = [answer(b'{"n":%d}' % i) for i in range(6)]
    client = RawHTTP(base, {}, connect_timeout=2)
    bodies = [b'{"q":%d}' % i for i in range(6)]
    answers = await asyncio.gather(*(client.post("/chat/completions", body) for body in bodies))
    client.close()
    assert sorted(a.body for a in answers) == sorted(b'{"n":%d}' % i for i in range(6))
    assert sorted(r.split(b"\r\n\r\n", 1)[1] for r in s.requests) == sorted(bodies)
    assert s.connections == 6  # one request at a time on a connection: six in one turn took six


async def test_chunked_gzip_and_errors_statuses(server: tuple[Server, str]) -> None:
    s, base = server
    packed = gzip.compress(b'{"zipped":true}')
    s.answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n",
        answer(packed, "content-encoding: gzip"),
        b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 3\r\ncontent-length: 2\r\n\r\n{}",
    ]
    client = RawHTTP(base, {}, connect_timeout=2)
    assert (await client.post("/x", b"{}")).body == b'{"a":1}'
    assert (await client.post("/x", b"{}")).body == b'{"zipped":true}'
    refused = await client.post("/x", b"{}")
    assert (refused.status, refused.headers["retry-after"]) == (429, "3")
    client.close()


async def test_connection_closed_by_the_upstream(server: tuple[Server, str]) -> None:
    s, base = server
    s.close_after_answer = True
    s.answers = [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil-eof", answer(b"again")]
    client = RawHTTP(base, {}, connect_timeout=2)
    assert (await client.post("/x", b"{}")).body == b"until-eof"  # delimited by the end of the connection
    assert (await client.post("/x", b"{}")).body == b"again"  # on a new connection
    assert s.connections == 2
    client.close()


@pytest.mark.parametrize("kept_alive", [False, True])
async def test_deadline_closes_the_connection(server: tuple[Server, str], kept_alive: bool) -> None:
    """``deadline`` bounds a request on a new connection (asyncio.timeout) and on an idle one (a timer
    on the answer); either way TimeoutError, and the upstream sees the connection go."""
    s, base = server
    client = RawHTTP(base, {}, connect_timeout=2)
    if kept_alive:
        s.answers = [answer(b"first")]
        assert (await client.post("/x", b"{}")).body == b"first"
    s.hang = True
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await client.post("/x", b"{}", deadline=client.clock() + 0.3)
    assert 0.25 < asyncio.get_running_loop().time() - started < 3
    await asyncio.wait_for(s.disconnected.wait(), 5)
    assert s.connections == 1
    s.hang, s.answers = False, [answer(b"after")]
    assert (await client.post("/x", b"{}", deadline=client.clock() + 5)).body == b"after"  # a new connection
    client.close()


async def test_cancelled_request_closes_its_connection(server: tuple[Server, str]) -> None:
    s, base = server
    s.hang = True
    client = RawHTTP(base, {}, connect_timeout=2)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await client.post("/x", b"{}")
    await asyncio.wait_for(s.disconnected.wait(), 5)  # the upstream sees the caller go


async def test_unreachable_and_bad_input() -> None:
    client = RawHTTP("http://127.0.0.1:9/v1", {}, connect_timeout=2)
    with pytest.raises(OSError):
        await client.post("/x", b"{}")
    with pytest.raises(ValueError):
        RawHTTP("http://127.0.0.1:9/v1", {"x-evil": "a\r\nb: c"}, connect_timeout=2)
    with pytest.raises(ValueError):
        RawHTTP("ftp://example.com", {}, connect_timeout=2)
    assert issubclass(ProtocolError, OSError)


async def whole_lines(stream: RawStream) -> bytes:
    while (lines := stream.lines_nowait()) is None:
        await stream.wait()
    return lines


async def test_a_stream_is_read_by_line_and_its_connection_reused(server: tuple[Server, str]) -> None:
    s, base = server
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    chunks = [b"data: one\n\nda", b"ta: two\n\n"]  # the second event arrives split across chunks
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    s.answers = [head + body, answer(b"after")]
    client = RawHTTP(base, {}, connect_timeout=2)
    stream = await client.open_stream("/chat/completions", b"{}")
    assert (stream.status, stream.headers["content-type"]) == (200, "text/event-stream")
    lines = []
    while read := await whole_lines(stream):
        lines.append(read)
    assert b"".join(lines) == b"data: one\n\ndata: two\n\n" and stream.at_eof()
    assert all(read.endswith(b"\n") for read in lines)  # never half a line
    stream.close()
    assert (await client.post("/x", b"{}")).body == b"after"
    assert s.connections == 1  # the finished stream's connection carried the next request
    client.close()


async def test_an_unfinished_stream_is_cut_and_a_deadline_fails_its_read(server: tuple[Server, str]) -> None:
    s, base = server
    s.answers = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n"]  # and then nothing
    client = RawHTTP(base, {}, connect_timeout=2)
    stream = await client.open_stream("/x", b"{}")
    assert await stream.readany() == b"data:"
    stream.set_exception(TimeoutError())
    with pytest.raises(TimeoutError):
        await whole_lines(stream)
    stream.close()
    await asyncio.wait_for(s.disconnected.wait(), 5)  # the upstream sees the caller go


async def test_a_host_name_is_resolved_once_and_each_address_tried(server: tuple[Server, str]) -> None:
    s, base = server
    s.close_after_answer = True  # each request on a new connection
    s.answers = [answer(b"1", "connection: close"), answer(b"2", "connection: close")]
    client = RawHTTP(base.replace("127.0.0.1", "localhost"), {}, connect_timeout=2)  # ::1 may come first
    assert [(await client.post("/x", b"{}")).body for _ in range(2)] == [b"1", b"2"]
    assert s.connections == 2 and "host: localhost:" in s.requests[0].decode()
    client.close()


async def test_interim_answers_before_the_final_one_are_skipped(server: tuple[Server, str]) -> None:
    """A 1xx (100 Continue, a CDN's 103 Early Hints) may precede any answer (RFC 9110 15.2): the
    answer is the final one, its status, headers and body, whole or streamed."""
    s, base = server
    early = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
    limited = b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 3\r\ncontent-length: 4\r\n\r\nslow"
    s.answers = [b"HTTP/1.1 100 Continue\r\n\r\n" + early + answer(b'{"a":1}', "x-thing: yes"), early + limited,
                 early + answer(b"data: one\n\n", "content-type: text/event-stream")]
    client = RawHTTP(base, {}, connect_timeout=2)
    whole = await client.post("/x", b"{}")
    assert (whole.status, whole.body, whole.headers["x-thing"]) == (200, b'{"a":1}', "yes")
    assert "link" not in whole.headers
    refused = await client.open_stream("/x", b"{}")
    assert (refused.status, refused.headers["retry-after"], await refused.read()) == (429, "3", b"slow")
    refused.close()
    stream = await client.open_stream("/x", b"{}")
    assert (stream.status, stream.headers["content-type"]) == (200, "text/event-stream")
    assert await stream.read() == b"data: one\n\n" and stream.at_eof()
    stream.close()
    assert s.connections == 1  # each answer's connection kept alive for the next
    client.close()


async def test_a_kept_alive_connection_closed_unanswered_is_retried_once_on_a_new_one(
        server: tuple[Server, str]) -> None:
    """An idle connection the upstream closes as the next request goes out (its keep-alive time up;
    its FIN not yet here) ends before any byte of the answer: the request goes again on a new
    connection, once, whole or streamed. A new connection closed unanswered, or an answer cut part
    way, is not sent again."""
    s, base = server
    stream_answer = answer(b"data: one\n\n", "content-type: text/event-stream")
    s.answers = [answer(b"first"), b"", answer(b"second"), b"", stream_answer, b""]
    client = RawHTTP(base, {}, connect_timeout=2)
    assert (await client.post("/x", b"{}")).body == b"first"
    assert (await client.post("/x", b"{}", deadline=client.clock() + 5)).body == b"second"
    stream = await client.open_stream("/x", b"{}", deadline=client.clock() + 5)
    assert await stream.read() == b"data: one\n\n"
    stream.close()
    assert s.connections == 3 and len(s.requests) == 5
    with pytest.raises(ProtocolError):  # the third connection, kept alive, closed unanswered; then a new one too
        s.answers += [b"", b""]
        await client.post("/x", b"{}")
    assert s.connections == 4
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhalf"
    s.answers, s.closing = [answer(b"ok"), cut], [cut]
    assert (await client.post("/x", b"{}")).body == b"ok"
    with pytest.raises(ProtocolError):
        await client.post("/x", b"{}")
    assert s.connections == 5
    client.close()


async def test_a_kept_alive_connection_that_ends_answerless_later_is_not_retried(
        server: tuple[Server, str]) -> None:
    """Closed answerless well after its request went, a kept-alive connection may have had its request
    run (the upstream crashed while generating): it is not sent again, never to run one twice."""
    s, base = server
    s.answers, s.close_unanswered_after = [answer(b"first"), b""], STALE_CLOSE + 0.3
    client = RawHTTP(base, {}, connect_timeout=2)
    assert (await client.post("/x", b"{}")).body == b"first"
    with pytest.raises(ProtocolError):
        await client.post("/x", b"{}", deadline=client.clock() + 5)
    assert (s.connections, len(s.requests)) == (1, 2)
    client.close()


async def test_an_answer_head_past_its_limit_fails_the_request(server: tuple[Server, str]) -> None:
    """A head of a hundred kilobytes is read (a CDN's cookies); one that never ends is not kept in
    memory without bound: the request fails once it passes ``MAX_HEAD``."""
    s, base = server
    big = "x-big: " + "a" * 100_000
    endless = b"HTTP/1.1 200 OK\r\n" + b"x-more: " + b"a" * (MAX_HEAD + (1 << 20))
    s.answers = [answer(b"fine", big), endless]
    client = RawHTTP(base, {}, connect_timeout=2)
    fine = await client.post("/x", b"{}")
    assert (fine.body, len(fine.headers["x-big"])) == (b"fine", 100_000)
    with pytest.raises(ProtocolError, match="head"):
        await client.post("/x", b"{}", deadline=client.clock() + 5)
    client.close()


async def test_an_event_longer_than_the_high_water_is_read_whole(server: tuple[Server, str]) -> None:
    """One streamed line of megabytes (a base64 image in a chunk, a long prompt's logprobs) is read
    whole: reading pauses for unread whole lines, never for a line still coming."""
    s, base = server
    event = b"data: " + b"x" * (6 << 20) + b"\n\n"
    s.answers = [answer(event, "content-type: text/event-stream")]
    client = RawHTTP(base, {}, connect_timeout=2)
    stream = await client.open_stream("/x", b"{}")
    lines = []
    async with asyncio.timeout(10):
        while read := await whole_lines(stream):
            lines.append(read)
    assert b"".join(lines) == event
    stream.close()
    client.close()


async def test_a_lingering_stream_hands_its_connection_back_if_its_body_ends_in_time(
        server: tuple[Server, str]) -> None:
    """Closed after ``linger`` (what follows an SSE ``[DONE]`` is not wanted), a stream whose body
    has not ended returns at once; its connection goes back to the pool when the body ends within
    the lingering time, and is closed when it does not."""
    s, base = server
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    done = b"data: [DONE]\n\n"
    opened = head + b"%x\r\n%s\r\n" % (len(done), done)
    s.answers = [(opened, 0.1, b"0\r\n\r\n"), answer(b"reused"), (opened, 2.0, b"0\r\n\r\n"), answer(b"new")]
    client = RawHTTP(base, {}, connect_timeout=2)
    for body, connections in ((b"reused", 1), (b"new", 2)):
        stream = await client.open_stream("/x", b"{}")
        assert await whole_lines(stream) == done
        stream.linger(0.5)
        stream.close()
        await asyncio.sleep(0.7)
        assert (await client.post("/x", b"{}")).body == body
        assert s.connections == connections
    client.close()
