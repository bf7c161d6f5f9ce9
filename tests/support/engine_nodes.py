"""``switchyard engine serve`` as a separate process on a free loopback port (tests and bench/)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[2]


class EngineNode:
    def __init__(self, model: Path, workdir: Path, name: str, *flags: str, api_key: str | None = None) -> None:
        self.port = free_port()
        self.api_key = api_key
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.cmd = [sys.executable, "-c", "from gateway.cli import app; app()", "engine", "serve",
                    "--model", str(model), "--served-model-name", "tiny", "--port", str(self.port), *flags,
                    *(["--api-key", api_key] if api_key else [])]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> EngineNode:
        return self.launch().wait_ready(timeout)

    def launch(self) -> EngineNode:
        """Start the process without waiting (start several, then ``wait_ready`` each)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=self.log_path.open("wb"),
                                     stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 120.0) -> EngineNode:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine node exited during start-up:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"engine node {self.name} did not start in time")

    def stats(self) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.get(self.url + "/stats", headers=headers, timeout=10).json()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
