"""A private redis-server for tests that stop, pause or restart Redis (the machine's is never touched)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from tests.support.servers import free_port


class RedisProcess:
    """A redis-server of the test's own on a free port (the machine's Redis is never touched)."""

    def __init__(self, unix_socket: str | None = None) -> None:
        self.port = free_port()
        self.unix_socket = unix_socket  # also listen on this Unix socket
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.unix_socket is not None:
            cmd += ["--unixsocket", self.unix_socket]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections open but answers nothing."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
