"""A SIGTERM to ``serve --workers N`` while a worker is still starting: a worker that could not hear
its SIGTERM then is told again once it started, so the supervisor exits instead of waiting forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.serve_process import worker_pids
from tests.support.servers import free_port


def test_a_worker_deaf_to_the_first_sigterm_is_stopped_once_it_started(tmp_path: Path) -> None:
    hear = tmp_path / "hear"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.deaf_workers", str(port)],
                            env=os.environ | {"DEAF_UNTIL": str(hear)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("hear.*"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        workers = worker_pids(proc.pid)
        proc.terminate()  # both workers are told while they cannot hear it
        time.sleep(1)
        assert proc.poll() is None
        hear.touch()  # they start now, and would serve on
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert stderr.decode().count("started after the stop began: terminating it again") == 2
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            raise AssertionError("a worker still serves")
        except httpx.ConnectError:
            pass
    finally:
        if proc.poll() is None:
            for pid in worker_pids(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
