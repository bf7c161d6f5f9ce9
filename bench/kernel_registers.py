"""Registers and spills of the Triton attention kernels compiled for sm_90a, without a GPU.

    PYTHONPATH=. python bench/kernel_registers.py

Compiles each kernel at the tile sizes its launcher picks on a GPU for a few common head shapes
(bf16), then asks Triton's bundled ``ptxas`` for its resource use. One line per kernel and shape.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels.common import dot_precision
from engine.kernels.paged_attention import _paged_attention_kernel, tile_config
from engine.kernels.split_decode import _reduce_splits_kernel, _split_decode_kernel

SHAPES = {"qwen3-0.6B": (16, 8, 128), "llama3-8B": (32, 8, 128), "tinyllama": (32, 4, 64)}
INTS = dict.fromkeys(["window", "stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_bt"], "i32")
TABLES = dict(block_tables_ptr="*i32", context_lens_ptr="*i32", query_start_ptr="*i32", scale_log2="fp32")
PARTS = dict.fromkeys(["part_out_ptr", "part_m_ptr", "part_l_ptr"], "*fp32")
PTRS = dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], "*bf16")


def _ptxas() -> str:
    """The newest ptxas Triton ships (the PTX it emits may be too new for the older one)."""
    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return str(next(p for p in (folder / "ptxas-blackwell", folder / "ptxas") if p.exists()))


def resources(fn: triton.JITFunction, types: dict[str, str], consts: dict) -> str:
    params = list(inspect.signature(fn.fn).parameters)
    signature = {p: "constexpr" if p in consts else types[p] for p in params}
    src = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in consts.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        Path(path).write_text(ptx)
        log = subprocess.run([_ptxas(), "-v", "--gpu-name=sm_90a", path, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return f"regs={regs[-1] if regs else '?'} spill_stores={spills[-1] if spills else '?'}B"


def main() -> None:
    for name, (hq, hkv, d) in SHAPES.items():
        for decode in (False, True):
            tiles = tile_config(hq, hkv, d, decode=decode)
            consts = dict(tiles, BLOCK_SIZE=16, COMPUTE=tl.bfloat16, PRECISION=dot_precision(torch.bfloat16),
                          OFFSET=tl.int32)
            print(f"unified {'decode ' if decode else 'prefill'} {name}: "
                  f"{resources(_paged_attention_kernel, {**PTRS, **TABLES, **INTS}, consts)}", flush=True)
        group = hq // hkv
        for splits in (1, 16):
            consts = dict(NUM_KV_HEADS=hkv, GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=d,
                          BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=16, BLOCK_SIZE=16,
                          NUM_SPLITS=splits, OFFSET=tl.int32)
            types = {**PTRS, **PARTS, **TABLES, **INTS}
            print(f"split_decode {name} splits={splits}: {resources(_split_decode_kernel, types, consts)}", flush=True)
        consts = dict(NUM_HEADS=hq, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), NUM_SPLITS=16,
                      SPLITS_PAD=16)
        print(f"reduce {name}: {resources(_reduce_splits_kernel, {**PTRS, **PARTS, **INTS}, consts)}", flush=True)
    print(f"triton {triton.__version__}")


if __name__ == "__main__":
    main()
