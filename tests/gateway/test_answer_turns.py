"""The ends of answers under ``switchyard serve``'s protocol: the first to end in an event-loop turn
is written at once, the turn's later ones together at its end; a streamed answer's end (its last
event) is written at once whatever else ended in the turn; every answer arrives whole."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from typing import Any

from tests.support.servers import ServerThread

CLIENTS = 8


class ReleasedTogether:
    """Holds each request (``GET /<i>``) until all have come, then answers them in one turn, noting
    for each whether its client already had the answer when the app's work on it was done. The
    clients read only once ``noted`` is set for ``expected`` answers: a client that had read its
    answer first would look as if it had none yet."""

    def __init__(self, clients: list[socket.socket], streamed: bool = False) -> None:
        self.clients = clients
        self.streamed = streamed
        self.arrived = 0
        self.all_in: asyncio.Event | None = None
        self.at_once: dict[int, bool] = {}
        self.expected = CLIENTS
        self.noted = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        i = int(scope["path"].strip("/"))
        if self.all_in is None:
            self.all_in = asyncio.Event()
        self.arrived += 1
        if self.arrived == CLIENTS:
            self.all_in.set()
        await self.all_in.wait()
        body = b"answer %d" % i
        if self.streamed:  # chunked, as the relayed streams are: an event, then the last one
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        else:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        readable, _, _ = select.select([self.clients[i]], [], [], 0)  # the client's socket: anything in?
        self.at_once[i] = bool(readable)
        if len(self.at_once) == self.expected:
            self.noted.set()


def read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1 << 16)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(1 << 16)
    return body


def read_stream(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += sock.recv(1 << 16)
    return data.split(b"\r\n\r\n", 1)[1]


def send_requests(clients: list[socket.socket], port: int) -> None:
    """Client ``i`` connects and sends ``GET /<i>``."""
    for i, sock in enumerate(clients):
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /%d HTTP/1.1\r\nhost: test\r\n\r\n" % i)


def test_streamed_answers_ending_in_one_turn_each_leave_at_once() -> None:
    clients = [socket.socket() for _ in range(CLIENTS)]
    app = ReleasedTogether(clients, streamed=True)
    try:
        with ServerThread(app) as server:
            send_requests(clients, server.port)
            assert app.noted.wait(10)
            assert app.at_once == dict.fromkeys(range(CLIENTS), True)
            for i, sock in enumerate(clients):
                assert b"data: answer %d\n\n" % i in read_stream(sock)
    finally:
        for sock in clients:
            sock.close()


def test_answers_ending_in_one_turn_leave_together_and_whole() -> None:
    clients = [socket.socket() for _ in range(CLIENTS)]
    app = ReleasedTogether(clients)
    try:
        with ServerThread(app) as server:
            send_requests(clients, server.port)
            assert app.noted.wait(10)
            assert any(app.at_once.values())  # the first to end in the turn: written at once
            assert not all(app.at_once.values())  # the others: at the turn's end, together
            assert [read_answer(sock) for sock in clients] == [b"answer %d" % i for i in range(CLIENTS)]
            app.at_once.clear()
            app.noted.clear()
            app.expected = 1
            clients[0].sendall(b"GET /0 HTTP/1.1\r\nhost: test\r\n\r\n")  # kept alive, and alone in its turn now
            assert app.noted.wait(10)
            assert app.at_once == {0: True}
            assert read_answer(clients[0]) == b"answer 0"
    finally:
        for sock in clients:
            sock.close()
