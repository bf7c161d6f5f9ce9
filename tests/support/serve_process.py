"""``switchyard serve`` as a separate process on a free loopback port (the production entry point)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.servers import free_port


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
