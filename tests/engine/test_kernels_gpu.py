"""On a CUDA machine only: decode CUDA graphs give the same greedy tokens as eager steps.

Runs in a subprocess with the Triton compiler (the interpreter tests of this suite set
``TRITON_INTERPRET=1`` for the whole pytest process, and graphs cannot capture interpreted kernels).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def graphs_vs_eager(path: str) -> None:
    from engine import LLM, SamplingParams
    from tests.engine.hf_checkpoints import build_checkpoint
    from tests.engine.test_engine_vs_transformers import MAX_NEW, prompts

    build_checkpoint("qwen3", Path(path))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW)
    runs = []
    for eager in (True, False):
        llm = LLM(path, device="cuda", attn_backend="triton", enforce_eager=eager, max_num_seqs=8, num_kv_blocks=64)
        assert (llm.engine.runner.graphs is None) == eager
        outs = llm.generate(prompts(llm.engine.hf_config.vocab_size), params)
        runs.append([o.outputs[0].token_ids for o in outs])
    assert runs[0] == runs[1], runs
    print("graphs == eager")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_match_eager(tmp_path: Path) -> None:
    code = f"from tests.engine.test_kernels_gpu import graphs_vs_eager; graphs_vs_eager({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "graphs == eager" in proc.stdout, proc.stderr[-4000:]
