"""Hostile clients at the HTTP level, against ``switchyard serve``: slow-loris heads, oversized
chunked bodies, control characters and CR/LF in keys and model names."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.db import migrate
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.serve_process import start_serve

LIMIT = 64 * 1024

# What java.net.http.HttpClient (and so Spring's RestClient, Ktor, many JVM OpenAI clients) sends over
# plain http:// by default: an offer to switch to HTTP/2, which the gateway declines by answering in
# HTTP/1.1 (RFC 9110 §7.8), the request's body read as any other's.
H2C = (b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
       b"http2-settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n")


@pytest.fixture(scope="module")
def served_at(fake_upstream_server: FakeUpstream,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The gateway's URL and its usage database."""
    work = tmp_path_factory.mktemp("served")
    db_url = f"sqlite+aiosqlite:///{work / 'gw.db'}"
    migrate.upgrade(db_url)
    config = {
        "server": {"max_body_bytes": LIMIT, "body_timeout": 2, "max_connections_per_client": 32},
        "auth": {"admin_key": ADMIN_KEY},
        "database": {"url": db_url},
        "usage": {"journal_dir": str(work / "journal")},
        "models": [{"name": "echo", "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "k"}]}],
    }  # fmt: skip
    proc, url, _ = start_serve(config, work, "--header-timeout", "1")
    yield url, work / "gw.db"
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def served(served_at: tuple[str, Path]) -> str:
    return served_at[0]


def _addr(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def raw_exchange(url: str, request: bytes) -> bytes:
    with socket.create_connection(_addr(url), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + _length(data):
            part = s.recv(65536)
            if not part:
                break
            data += part
        return data


def _length(data: bytes) -> int:
    head = data[: data.find(b"\r\n\r\n")].lower()
    at = head.find(b"content-length:")
    return int(head[at + 15:].split(b"\r\n")[0]) if at >= 0 else 0


def test_slow_loris_heads_are_cut_off_while_others_are_served(served: str, upstream: FakeUpstream) -> None:
    slow = [socket.create_connection(_addr(served), timeout=5) for _ in range(20)]
    try:
        for s in slow:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        cut: set[int] = set()
        while len(cut) < len(slow) and time.monotonic() - started < 8:
            # the worker is not pinned: a normal request is answered meanwhile
            assert httpx.get(served + "/healthz", timeout=2).status_code == 200
            for i, s in enumerate(slow):
                if i in cut:
                    continue
                try:
                    s.sendall(b"x-dribble: 1\r\n")  # one more header line, never the blank line
                    s.settimeout(0.01)
                    if s.recv(1) == b"":
                        cut.add(i)
                except TimeoutError:
                    pass
                except OSError:
                    cut.add(i)
            time.sleep(0.2)
        assert len(cut) == len(slow)  # every slow head was closed by the server
    finally:
        for s in slow:
            s.close()


def test_oversized_chunked_body_is_413(served: str, upstream: FakeUpstream) -> None:
    def body() -> Iterator[bytes]:
        yield b'{"model": "echo", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 1024 + 8):
            yield b"x" * 1024
        yield b'"}]}'

    r = httpx.post(served + "/v1/chat/completions", content=body(), timeout=10,
                   headers={"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("key", [b"sk-\x00abc", b"sk-\x7f\x01", b"\xff\xfe\xfd", b"sk-" + b"a" * 10_000,
                                 ADMIN_KEY.encode() + b"\x0b"])
def test_odd_bytes_in_keys_are_401(served: str, upstream: FakeUpstream, key: bytes) -> None:
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
    answer = raw_exchange(served, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"authorization: Bearer " + key + b"\r\ncontent-length: " + str(len(body)).encode()
                          + b"\r\n\r\n" + body)
    status = int(answer[9:12])
    assert status in (400, 401), answer[:300]
    if status == 401:
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "authentication_error"


def test_crlf_in_a_model_name_goes_nowhere(served: str, upstream: FakeUpstream) -> None:
    model = "echo\r\nx-injected: 1\r\n\r\nHTTP/1.1 200 OK"
    r = httpx.post(served + "/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "x-injected" not in r.headers
    r = httpx.get(served + "/v1/models/echo%0d%0ax-injected:%201", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 404 and "x-injected" not in r.headers
    # a request id supplied by the client is never reflected into our headers
    r = httpx.get(served + "/v1/models", headers={"authorization": f"Bearer {ADMIN_KEY}", "x-request-id": "evil"})
    assert r.status_code == 200 and r.headers["x-request-id"] != "evil"


def test_gateway_survived_it_all(served: str, upstream: FakeUpstream) -> None:
    r = httpx.post(served + "/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10,
                   json={"model": "echo", "messages": [{"role": "user", "content": "still here"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "still here"


@pytest.mark.parametrize("extra", [b"", H2C], ids=["plain", "h2c-offer"])
def test_slow_body_is_cut_at_body_timeout_with_a_408(served: str, upstream: FakeUpstream, extra: bytes) -> None:
    """A body trickled in a byte at a time by an authenticated client is cut at server.body_timeout (2 s here)."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n" + extra + b"content-length: 1000\r\n\r\n")
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(head)
        started = time.monotonic()
        answer = b""
        while time.monotonic() - started < 8:
            try:
                s.sendall(b" ")
            except OSError:
                break
            s.settimeout(0.3)
            try:
                part = s.recv(65536)
            except TimeoutError:
                continue
            if not part:
                break
            answer += part
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"body_timeout" in answer
    assert 1.5 <= elapsed < 5, elapsed


def test_connections_per_client_address_are_capped(served: str, upstream: FakeUpstream) -> None:
    """server.max_connections_per_client is 32 here: the 33rd open connection is answered 429 and closed;
    once the others close, the address is served again."""
    held = [socket.create_connection(_addr(served), timeout=5) for _ in range(32)]
    try:
        time.sleep(0.3)
        with socket.create_connection(_addr(served), timeout=5) as extra:
            answer = extra.recv(65536)
        assert answer.startswith(b"HTTP/1.1 429"), answer
        assert b"retry-after" in answer.lower()
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(served + "/healthz", timeout=5).status_code == 200


def _send_reading(url: str, request: bytes) -> bytes:
    """Send ``request`` whatever the server does meanwhile, and read its answer until it closes."""
    with socket.create_connection(_addr(url), timeout=10) as s:
        try:
            s.sendall(request)
        except OSError:  # the server answered and closed before taking it all
            pass
        answer = b""
        try:
            while part := s.recv(65536):
                answer += part
        except OSError:
            pass
        return answer


@pytest.mark.parametrize("head", [
    b"x-long: " + b"a" * 4_000_000 + b"\r\n",  # one header value
    b"".join(b"x-h%d: v\r\n" % i for i in range(200_000)),  # many headers
], ids=["long-value", "many-headers"])
def test_an_oversized_request_head_is_431(served: str, upstream: FakeUpstream, head: bytes) -> None:
    """A request head is held (and re-copied per read by the parser) until it is complete: one over
    64 KiB is refused 431 in OpenAI's error shape, not taken into memory whole."""
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
    answer = _send_reading(served, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                           + ADMIN_KEY.encode() + b"\r\n" + head + b"content-length: %d\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_header_fields_too_large"


def test_an_incomplete_head_over_the_limit_in_one_read_is_431(served: str) -> None:
    """120 KB of a head with no end, sent at once (one read or two), is answered at once, not held
    until the header timeout."""
    with socket.create_connection(_addr(served), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 120_000)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:300]


def test_many_small_pipelined_requests_in_one_read_are_served(served: str) -> None:
    """A read that holds many whole requests and the start of the next is not taken for one large head."""
    one = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    count = 2 * LIMIT // len(one)
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(one * count + one[:20])
        time.sleep(0.2)
        s.sendall(one[20:])
        data = b""
        while data.count(b"HTTP/1.1 ") < count + 1 or not data.endswith(b"}"):
            part = s.recv(1 << 20)
            assert part, data[-300:]
            data += part
    assert data.count(b"HTTP/1.1 200 OK") == count + 1, data[-300:]


def test_endless_trailer_fields_are_431_before_the_body_timeout(served: str) -> None:
    """A chunked body's trailer fields are kept as a head's are: they are bounded as one, not taken
    into memory for as long as the body timeout lets them come."""
    head, body = _chat("trailers", extra=b"", chunked=True)
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(head + body.removesuffix(b"\r\n"))  # the last chunk, its trailer section open
        started = time.monotonic()
        with contextlib.suppress(OSError):  # answered and closed while still sending
            for _ in range(20):
                s.sendall(b"x-trailer: v\r\n" * 1500)
                time.sleep(0.02)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431") and time.monotonic() - started < 2, answer[:300]


def test_a_large_head_under_the_limit_is_served(served: str, upstream: FakeUpstream) -> None:
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
    answer = _send_reading(served, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                           b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nx-long: " + b"a" * 40_000
                           + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


@pytest.mark.parametrize("request_", [
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
    b"FOO /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-\x00\r\n\r\n",
], ids=["bad-length", "length-and-chunked", "unknown-method", "nul-in-header"])
def test_a_malformed_request_is_a_400_in_openai_shape(served: str, upstream: FakeUpstream, request_: bytes) -> None:
    answer = _send_reading(served, request_)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["error"] == {"message": "The request is not valid HTTP/1.1.",
                                         "type": "invalid_request_error", "param": None,
                                         "code": "invalid_http_request"}



def _chat(content: str, extra: bytes = H2C, chunked: bool = False) -> tuple[bytes, bytes]:
    """A chat completion's head and body, the body framed by length or in chunks."""
    body = json.dumps({"model": "echo", "messages": [{"role": "user", "content": content}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n" + extra)
    if chunked:
        half = len(body) // 2
        return head + b"transfer-encoding: chunked\r\n\r\n", b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (
            half, body[:half], len(body) - half, body[half:])
    return head + b"content-length: %d\r\n\r\n" % len(body), body


class Answers:
    """Responses, each with a content-length, read in turn from one connection."""

    def __init__(self, s: socket.socket) -> None:
        self.s, self.data = s, b""

    def next(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.data or len(self.data) < self.data.find(b"\r\n\r\n") + 4 + _length(self.data):
            part = self.s.recv(65536)
            assert part, f"the connection closed after {self.data[:300]!r}"
            self.data += part
        head, _, rest = self.data.partition(b"\r\n\r\n")
        length = _length(self.data)
        body, self.data = rest[:length], rest[length:]
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        return int(lines[0][9:12]), headers, body

    def chat(self, content: str, db: Path) -> None:
        """The next answer is the echo of ``content``, with one usage row."""
        status, headers, body = self.next()
        assert status == 200, body
        assert json.loads(body)["choices"][0]["message"]["content"] == content
        assert _usage_rows(db, headers["x-request-id"]) == 1


def _usage_rows(db: Path, request_id: str) -> int:
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(db) as conn:
            count = int(conn.execute("SELECT count(*) FROM usage_records WHERE request_id = ?",
                                     (request_id,)).fetchone()[0])
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.mark.parametrize("later", [False, True], ids=["body-in-same-read", "body-in-later-read"])
def test_an_h2c_upgrade_offer_is_declined_and_the_body_read(served_at: tuple[str, Path], upstream: FakeUpstream,
                                                            later: bool) -> None:
    url, db = served_at
    head, body = _chat("over h2c")
    with socket.create_connection(_addr(url), timeout=10) as s:
        answers = Answers(s)
        if later:  # the head itself in two reads
            for part in (head[:40], head[40:], body):
                s.sendall(part)
                time.sleep(0.2)
        else:
            s.sendall(head + body)
        answers.chat("over h2c", db)
        head, body = _chat("kept alive", extra=b"")  # the same connection serves the next request
        s.sendall(head + body)
        answers.chat("kept alive", db)
        head, body = _chat("offered again", chunked=True)
        s.sendall(head + body)
        answers.chat("offered again", db)


def test_pipelined_h2c_offers_are_answered_in_order(served_at: tuple[str, Path], upstream: FakeUpstream) -> None:
    url, db = served_at
    first, second, third = _chat("first"), _chat("second", chunked=True), _chat("third", extra=b"")
    with socket.create_connection(_addr(url), timeout=10) as s:
        answers = Answers(s)
        s.sendall(b"".join(first + second + third))
        for content in ("first", "second", "third"):
            answers.chat(content, db)


def test_an_h2c_upgrade_offer_without_a_body_is_served(served: str, upstream: FakeUpstream) -> None:
    with socket.create_connection(_addr(served), timeout=10) as s:
        answers = Answers(s)
        for _ in range(2):
            s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + ADMIN_KEY.encode()
                      + b"\r\n" + H2C + b"\r\n")
            status, _, body = answers.next()
            assert status == 200, body
            assert [m["id"] for m in json.loads(body)["data"]] == ["echo"]


def test_a_websocket_upgrade_is_still_uvicorns(served: str, upstream: FakeUpstream) -> None:
    """The gateway has no WebSocket routes: the handshake is refused, as before."""
    answer = _send_reading(served, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
                           b"upgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           b"sec-websocket-version: 13\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403"), answer[:300]


def _read_until_closed_or_quiet(s: socket.socket) -> bytes:
    data = b""
    s.settimeout(1)
    try:
        while part := s.recv(65536):
            data += part
    except TimeoutError:
        pass
    return data


def test_a_body_in_a_transfer_coding_other_than_chunked_is_501(served: str, upstream: FakeUpstream) -> None:
    """``Transfer-Encoding: gzip, chunked``: the parser undoes only the chunks, so the body would reach
    the JSON decoder still gzipped. Refused 501 after the request pipelined before it is answered."""
    head, body = _chat("first", extra=b"", chunked=True)
    coded = gzip.compress(json.dumps({"model": "echo", "messages": [{"role": "user", "content": "x"}]}).encode())
    refused = head.replace(b"transfer-encoding: chunked", b"transfer-encoding: gzip, chunked")
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(head + body + refused + b"%x\r\n%b\r\n0\r\n\r\n" % (len(coded), coded))
        answers = Answers(s)
        status, _, first = answers.next()
        assert status == 200 and json.loads(first)["choices"][0]["message"]["content"] == "first"
        status, headers, error = answers.next()
        assert status == 501 and headers["connection"] == "close"
        assert json.loads(error)["error"]["code"] == "unsupported_transfer_encoding"
        assert _read_until_closed_or_quiet(s) == b""


@pytest.mark.parametrize(("refused", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /v1/models HTTP/1.1\r\nx-big: " + b"a" * (LIMIT + 1024), 431),
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", 400),
], ids=["unparsable-head", "oversized-head", "unparsable-body"])
def test_a_request_refused_after_pipelined_ones_is_answered_after_them(
        served_at: tuple[str, Path], upstream: FakeUpstream, refused: bytes, status: int) -> None:
    """The refusal of a request the parser cannot take does not take the place of the answers owed
    to the requests before it on the connection, however long they take (past the head deadline)."""
    url, db = served_at
    upstream.fail_next(Fault(delay=1.5))
    first, second = _chat("first", extra=b""), _chat("second", extra=b"", chunked=True)
    with socket.create_connection(_addr(url), timeout=10) as s:
        s.sendall(b"".join(first + second) + refused)
        answers = Answers(s)
        answers.chat("first", db)
        answers.chat("second", db)
        got, headers, error = answers.next()
        assert got == status and headers["connection"] == "close"
        assert json.loads(error)["error"]["type"] == "invalid_request_error"
        assert _read_until_closed_or_quiet(s) == b""


def test_an_http10_expectation_of_100_continue_is_ignored(served: str, upstream: FakeUpstream) -> None:
    """HTTP/1.0 has no 1xx answers: a ``100 Continue`` would be the 1.0 client's whole answer."""
    head, body = _chat("over 1.0", extra=b"expect: 100-continue\r\n")
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(head.replace(b"HTTP/1.1", b"HTTP/1.0"))
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(1)  # nothing until the body comes
        s.settimeout(10)
        s.sendall(body)
        status, _, answer = Answers(s).next()
    assert status == 200 and json.loads(answer)["choices"][0]["message"]["content"] == "over 1.0"


def test_head_is_get_without_its_body(served: str, upstream: FakeUpstream) -> None:
    """HEAD on a GET route (uptime monitors probe with it) answers as GET would, with no body, and
    the connection goes on; on a POST-only route it is a 405 naming the methods there are."""
    auth = f"authorization: Bearer {ADMIN_KEY}\r\n".encode()
    get = httpx.get(served + "/v1/models", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    with socket.create_connection(_addr(served), timeout=10) as s:
        s.sendall(b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
                  b"HEAD /v1/models HTTP/1.1\r\nhost: x\r\n" + auth + b"\r\n"
                  b"HEAD /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + auth + b"\r\n"
                  b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 4 or not data.endswith(b"}"):
            part = s.recv(65536)
            assert part, data
            data += part
    heads = [h for h in data.split(b"HTTP/1.1 ")[1:]]
    assert [h[:3] for h in heads] == [b"200", b"200", b"405", b"200"]
    assert all(h.endswith(b"\r\n\r\n") for h in heads[:2])  # no body after a HEAD's head
    assert f"content-length: {len(get.content)}".encode() in heads[1].lower()
    allow = next(line for line in heads[2].lower().split(b"\r\n") if line.startswith(b"allow:"))
    assert b"post" in allow.split(b":", 1)[1].replace(b" ", b"").split(b",")  # in any order
