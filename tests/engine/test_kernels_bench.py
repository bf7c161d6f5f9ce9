"""``bench/engine_gpu.py --cpu-smoke``: the GPU benchmark's own self-check, run on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_cpu_smoke() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_gpu.py"), "--cpu-smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("metric"))):]
    text = "\n".join(table)
    assert "FAIL" not in text
    assert text.count(" ok") >= 4  # three kernel checks + triton == torch greedy tokens
    for row in ("ours: output tok/s", "copy bandwidth", "decode step b=2", "attention decode", "attention prefill"):
        assert row in text, text
