"""The benchmark harness says which interpreter a reading was taken on, and ``make`` makes the venv
from the one it is given (docs/deployment.md); ``bench.stream_cost`` fits a line; ``bench.rss_rounds``
reads a process's resident memory by kind; the harness counts each worker's connections."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from bench.harness import ROOT, connections_per_worker, interpreter
from bench.rss_rounds import resident_mib
from bench.stream_cost import fit


def test_interpreter_names_version_path_and_build() -> None:
    line = interpreter()
    assert line.startswith(f"cpython {platform.python_version()} at {Path(sys.executable).resolve()}")
    assert "configure flags: " in line
    assert line.endswith(("interpreter in a shared libpython", "interpreter in the executable"))


def test_interpreter_that_cannot_run_is_said_so(tmp_path: Path) -> None:
    missing = tmp_path / "python3"
    assert interpreter(missing) == f"{missing} (not described: [Errno 2] No such file or directory: '{missing}')"


def test_make_builds_the_venv_from_the_python_it_is_given(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-n", "install", "PYTHON=/opt/py/bin/python3", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert f"/opt/py/bin/python3 -m venv {venv}" in plan.splitlines()


def test_stream_cost_fit_is_least_squares() -> None:
    assert fit([(1, 3.0), (3, 7.0)]) == (1.0, 2.0)
    intercept, slope = fit([(0, 1.0), (1, 2.0), (2, 2.0)])
    assert (round(intercept, 6), round(slope, 6)) == (1.166667, 0.5)


def test_resident_memory_is_read_by_kind() -> None:
    """A fresh interpreter holding 64 MiB it wrote: read from outside, as the bench reads a worker
    (this process's own counters, with torch's threads, can lag behind its page faults)."""
    code = "import sys; held = bytes(range(256)) * (1 << 18); print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        anon, mapped = resident_mib(child.pid)
        assert 64 < anon < 200 and 0 < mapped
    finally:
        child.communicate("")


def test_connections_per_worker_counts_the_accepted_ones() -> None:
    """This process listens, holds three accepted connections and their clients' ends: three."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [server.accept()[0] for _ in clients]
        try:
            assert connections_per_worker([os.getpid()], port) == [3]
        finally:
            for sock in clients + accepted:
                sock.close()
