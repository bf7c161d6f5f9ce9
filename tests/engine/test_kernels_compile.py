"""The Triton kernels compile to PTX for an H100-class GPU (sm_90), without a GPU.

The interpreter tests check what the kernels compute; this checks that the same source passes
Triton's real compiler at the tile sizes the launchers pick on a GPU (bf16 with tensor-core dots,
fp32 with IEEE dots, the split-KV pair, the store). It runs in a subprocess because Triton fixes
interpreter vs compiler mode when a kernel module is imported.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _compile(fn, types: dict[str, str], consts: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    signature = {p: "constexpr" if p in consts else types[p] for p in params}
    src = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def compile_all() -> None:
    """Compile every kernel for Qwen3-0.6B's head shape (16 query heads, 8 KV heads, head_dim 128)."""
    import torch
    import triton.language as tl

    from engine.kernels.common import dot_precision
    from engine.kernels.paged_attention import _paged_attention_kernel, tile_config
    from engine.kernels.split_decode import _reduce_splits_kernel, _split_decode_kernel
    from engine.kernels.store_kv import _store_kv_kernel

    ints = dict.fromkeys(["window", "stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_bt",
                          "stride_kt", "stride_kh", "stride_vt", "stride_vh"], "i32")
    tables = dict(block_tables_ptr="*i32", context_lens_ptr="*i32", query_start_ptr="*i32", scale_log2="fp32")
    for dt, tl_dt, torch_dt in (("bf16", tl.bfloat16, torch.bfloat16), ("fp32", tl.float32, torch.float32)):
        ptrs = dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], f"*{dt}")
        for decode in (False, True) if dt == "bf16" else (False,):
            tiles = tile_config(16, 8, 128, decode=decode)
            consts = dict(tiles, BLOCK_SIZE=16, COMPUTE=tl_dt, PRECISION=dot_precision(torch_dt), OFFSET=tl.int32)
            ptx = _compile(_paged_attention_kernel, {**ptrs, **tables, **ints}, consts)
            if dt == "bf16" and not decode:  # Hopper tensor cores (fp32 inputs take exact FMA dots instead)
                assert "wgmma.mma_async" in ptx and ".f32.bf16.bf16" in ptx
    parts = dict.fromkeys(["part_out_ptr", "part_m_ptr", "part_l_ptr"], "*fp32")
    ptrs = dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], "*bf16")
    _compile(_split_decode_kernel, {**ptrs, **parts, **tables, **ints},
             dict(NUM_KV_HEADS=8, GROUP=2, GROUP_PAD=2, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=16, BLOCK_SIZE=16,
                  NUM_SPLITS=4, OFFSET=tl.int32))
    _compile(_split_decode_kernel, {**ptrs, **parts, **tables, **ints},
             dict(NUM_KV_HEADS=8, GROUP=2, GROUP_PAD=2, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=16, BLOCK_SIZE=16,
                  NUM_SPLITS=1, OFFSET=tl.int64))
    _compile(_reduce_splits_kernel, {**ptrs, **parts, **ints},
             dict(NUM_HEADS=16, HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=4, SPLITS_PAD=4))
    _compile(_store_kv_kernel, {"k_ptr": "*bf16", "v_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
                                "slot_ptr": "*i64", **ints}, dict(NUM_HEADS=8, HEAD_DIM=128, HEADS_PAD=8, BLOCK_D=128))
    # Values that change from step to step must not specialise (a recompile mid-run otherwise).
    for kernel in (_paged_attention_kernel, _split_decode_kernel):
        assert {"window", "stride_bt"} <= set(kernel.do_not_specialize)
    print("compiled")


def test_kernels_compile_for_sm90() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    code = "from tests.engine.test_kernels_compile import compile_all; compile_all()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-4000:]
