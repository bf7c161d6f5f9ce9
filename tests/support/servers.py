"""Run an ASGI app with uvicorn on a loopback port in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn

from gateway.cli.http_protocol import HeadDeadlineProtocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """``with ServerThread(app) as server: server.url`` — started on a free port, stopped on exit."""

    def __init__(self, app: Any, *, lifespan: str = "on", startup_timeout: float = 30.0) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app, lifespan=lifespan, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
            http=HeadDeadlineProtocol,  # switchyard serve's (and its direct stream writes)
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OnLoopback:
    """For an ASGI app object that serves itself: ``start()`` on a free loopback port (returns the
    app), ``stop()``, and ``url`` (the OpenAI-style base, ``.../v1``)."""

    _server: ServerThread | None = None

    def start(self) -> Self:
        self._server = ServerThread(self, lifespan="off").start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url + "/v1"
