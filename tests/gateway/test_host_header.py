"""RFC 9112 §3.2: an HTTP/1.1 request without a ``Host`` header, and any request with more than one,
is answered 400 (in OpenAI's error shape, naming the header) and never run; an HTTP/1.0 request
may leave ``Host`` out. Raw requests on loopback against the gateway's HTTP protocol."""

from __future__ import annotations

import json
import socket

import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv

AUTH = f"authorization: Bearer {ADMIN_KEY}\r\n".encode()


def _exchange(env: GatewayEnv, request: bytes) -> bytes:
    """Send ``request`` and read until the gateway closes the connection."""
    with socket.create_connection(("127.0.0.1", env.server.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while part := s.recv(65536):
            data += part
        return data


def _answers(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """Each answer's status, head and body (bodies by content-length)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        out.append((int(head[9:12]), head, rest[:length]))
        data = rest[length:]
    return out


def _assert_host_refused(status: int, head: bytes, body: bytes) -> None:
    assert status == 400, head
    assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_host_header"
    assert "Host header" in error["message"]


@pytest.mark.parametrize("hosts", [b"", b"host: a\r\nhost: a\r\n", b"Host: a\r\nx-other: 1\r\nHOST: b\r\n"],
                         ids=["none", "two", "two-in-other-cases"])
def test_an_http11_request_without_exactly_one_host_is_400(env: GatewayEnv, hosts: bytes) -> None:
    request = b"POST /v1/chat/completions HTTP/1.1\r\n" + hosts + AUTH + b"content-type: application/json\r\n"
    body = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "x"}]}).encode()
    [(status, head, error)] = _answers(_exchange(env, request + b"content-length: %d\r\n\r\n" % len(body) + body))
    _assert_host_refused(status, head, error)
    assert env.usage.records == [] and env.admission.settled == []  # never run


def test_a_refused_request_is_answered_after_those_pipelined_before_it(env: GatewayEnv) -> None:
    good = b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n"
    answers = _answers(_exchange(env, good + good + b"GET /healthz HTTP/1.1\r\n\r\n" + good))
    assert [a[0] for a in answers] == [200, 200, 400]
    _assert_host_refused(*answers[2])


def test_an_http10_request_may_leave_host_out_but_not_send_two(env: GatewayEnv) -> None:
    [(status, _, body)] = _answers(_exchange(env, b"GET /v1/models HTTP/1.0\r\n" + AUTH + b"\r\n"))
    assert status == 200 and json.loads(body)["object"] == "list"
    [refused] = _answers(_exchange(env, b"GET /v1/models HTTP/1.0\r\nhost: a\r\nhost: b\r\n" + AUTH + b"\r\n"))
    _assert_host_refused(*refused)


def test_one_host_is_served(env: GatewayEnv) -> None:
    [(status, _, body)] = _answers(_exchange(env, b"GET /v1/models HTTP/1.1\r\nHost: a\r\nconnection: close\r\n"
                                             + AUTH + b"\r\n"))
    assert status == 200 and json.loads(body)["object"] == "list"
