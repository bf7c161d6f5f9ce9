"""``bench.stream_wait``'s probe installs itself on the gateway's current code only when asked, and
its table reads the samples it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.harness import ROOT
from bench.stream_wait import PROBES, table


def run_with_probe(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "STREAM_WAIT_OUT"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=environ | {"PYTHONPATH": f"{PROBES}{os.pathsep}{ROOT}"} | env)


def test_probe_does_nothing_without_its_variable() -> None:
    done = run_with_probe("import gc, sys, sitecustomize; print(gc.freeze.__module__, 'gateway' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gc", "False"]


def test_probe_wraps_the_gateway_functions_and_writes_at_exit(tmp_path: Path) -> None:
    out = tmp_path / "stamps.json"
    code = ("import gc; gc.freeze(); from backends.raw_http import RawHTTP; "
            "print(RawHTTP.open_stream.__module__, gc.freeze.__module__)")
    done = run_with_probe(code, STREAM_WAIT_OUT=str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sitecustomize", "gc"]  # wrapped once, and the hook put back
    written = json.loads(out.read_text())
    assert len(written["segments"]) == 6 and written["samples"] == []


def test_table_gives_each_step_and_the_whole_with_the_slowest_means() -> None:
    samples = [[0.001] * 6 for _ in range(49)] + [[0.001, 0.001, 0.001, 0.020, 0.001, 0.001]]
    rows = table([f"step {i}" for i in range(6)], samples)
    assert [r[0] for r in rows][-1].startswith("whole")
    assert rows[3][1:] == ["1.000", "1.000", "20.000", "20.000"]  # the slow sample's step, alone in the slowest 2 %
    assert rows[-1][1:] == ["6.000", "6.000", "25.000", "25.000"]
