"""``switchyard serve`` as a separate process on a free loopback port (the production entry point)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.servers import free_port

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")


def start_serve(config: dict[str, Any], workdir: Path, *args: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """(process, base URL, log path) once ``/healthz`` answers; the caller stops the process."""
    path = workdir / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "gw.log"
    exe = Path(sys.executable).parent / "switchyard"
    proc = subprocess.Popen([str(exe), "serve", "--config", str(path), "--port", str(port), *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited during start-up:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gateway did not start")


def worker_pids(pid: int) -> set[int]:
    """The worker processes of the ``switchyard serve`` supervisor ``pid``."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(c) for c in children if b"spawn_main" in _cmdline(int(c))}


def _cmdline(pid: int) -> bytes:
    """``pid``'s command line; empty once it has exited (a worker replaced mid-restart does)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


@contextmanager
def serving_workers(config: dict[str, Any], workdir: Path, workers: int,
                    timeout: float = 120) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``switchyard serve --workers N`` on ``config`` (its database migrated first), once every
    worker runs and ``/healthz`` answers: (process, base URL). Stopped with SIGTERM, which must
    end it cleanly (exit 0)."""
    path = workdir / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(path)], cwd=workdir, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([SWITCHYARD, "serve", "--config", str(path), "--port", str(port),
                             "--workers", str(workers)],
                            cwd=workdir, stdout=(workdir / "gw.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while len(worker_pids(proc.pid)) < workers or not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)
        yield proc, url
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
