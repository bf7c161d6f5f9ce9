"""The relay writes a stream's chunks itself, from the upstream's callbacks; a client that reads
slowly gets all of it, in order: the direct writes stop when the client's buffer is full and the
rest waits for it (nothing dropped, nothing reordered)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from unittest.mock import patch
from urllib.parse import urlsplit

import openai

from gateway.cli import http_protocol
from gateway.streaming import SSERelay
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream

WORDS = 25_000  # about 6 MB of events: more than the gateway's socket and transport buffers hold


def _chunked_body(raw: bytes) -> bytes:
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        body += rest[:size]
        rest = rest[size + 2:]


def test_a_slow_reader_gets_every_chunk_in_order(env: GatewayEnv, upstream: FakeUpstream) -> None:
    url = urlsplit(env.base_url)
    upstream.options.output_words = WORDS
    payload = json.dumps({"model": "echo", "stream": True, "max_tokens": WORDS,
                          "messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the gateway must wait
        sock.connect((url.hostname, url.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n" % len(payload) + payload)
        time.sleep(1.0)  # the upstream has sent everything by now; the gateway holds what the client has not read
        raw = bytearray()
        while data := sock.recv(65536):
            raw += data
            time.sleep(0.001)  # and the client goes on reading slowly
    events = [line[6:] for line in _chunked_body(bytes(raw)).split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(t for t in text if t) == " ".join(f"w{i}" for i in range(WORDS))
    assert all(c["model"] == "echo" for c in chunks)
    record = env.usage.wait_for(1)[0]
    assert record.completion_tokens == WORDS and record.extra == {"outcome": "completed"}
    assert upstream.streams[-1].completed


def test_chunks_after_the_first_are_written_from_the_upstream_callback(env: GatewayEnv,
                                                                      upstream: FakeUpstream) -> None:
    """Served by switchyard serve's protocol, the relay writes chunks itself (no task switch per chunk)."""
    upstream.options.chunk_delay = 0.002
    pushed = []
    original = SSERelay._pushed

    def counting(relay: SSERelay, chunk: Any) -> bool:
        pushed.append(chunk)
        return original(relay, chunk)

    client = openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)
    with patch.object(SSERelay, "_pushed", counting):
        stream = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c d e f"}],
                                                stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "a b c d e f"
    assert len(pushed) >= 5  # all but the first (and any a full client buffer sent the other way)


def test_every_chunk_is_written_as_soon_as_it_is_ready(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """The first chunk (pulled by the response's task) is written at once too, with the response's
    head, not at the end of the loop's turn: every event the client gets went through the
    synchronous writer, but the last, ``[DONE]``, which leaves with the end of the body."""
    written: list[bytes] = []
    write_body_now = http_protocol._write_body_now

    def recording(request: Any, data: bytes) -> bool:
        done = write_body_now(request, data)
        if done:
            written.append(data)
        return done

    url = urlsplit(env.base_url)
    payload = json.dumps({"model": "echo", "stream": True,
                          "messages": [{"role": "user", "content": "a b c"}]}).encode()
    with patch.object(http_protocol, "_write_body_now", recording), socket.socket() as sock:
        sock.connect((url.hostname, url.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n" % len(payload) + payload)
        raw = bytearray()
        while data := sock.recv(65536):
            raw += data
    body = _chunked_body(bytes(raw))
    assert body.endswith(b"data: [DONE]\n\n") and body.count(b"data: ") >= 5
    assert b"".join(written) + b"data: [DONE]\n\n" == body
