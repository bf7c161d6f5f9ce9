"""The device check (bench/gpu_check.py) runs end to end at toy sizes on the CPU under the Triton
interpreter, so the script a GPU session will run as one command cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["preflight", "kernels", "fp32-greedy", "bf16-agreement", "perf triton+graphs", "perf torch", "attention",
          "goals"]


def test_gpu_check_passes_at_toy_sizes_on_the_cpu() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    stages = [line.removeprefix("STAGE ").split(":")[0] for line in lines if line.startswith("STAGE ")]
    assert stages == STAGES, proc.stdout
    assert all(": ok " in line for line in lines if line.startswith("STAGE ")), proc.stdout
    assert "token-exact: llama/auto, llama/torch, qwen3/auto, qwen3/torch" in proc.stdout
    assert lines[-1].startswith("SUMMARY all stages ok")
