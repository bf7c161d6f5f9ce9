"""The engine's device check: one command on a fresh GPU machine, one line per stage.

    PYTHONPATH=. python bench/gpu_check.py          # CUDA GPU, the image's own torch, < 8 minutes
    PYTHONPATH=. python bench/gpu_check.py --cpu    # toy sizes under TRITON_INTERPRET=1 (the suite runs this)

Stages (each prints ``STAGE <name>: ok|FAIL|SKIP <detail> (<seconds>s)``; a failing stage does not
stop the later ones, its traceback goes to stderr):

- preflight: versions, the GPU (SMs, memory), a C compiler for Triton's launcher, what the engine's
  ``auto`` defaults resolve to;
- kernels: the Triton kernels vs the torch reference (mixed prefill/decode, split and single-split
  decode, sliding window, bf16);
- fp32-greedy: token-exact greedy decoding vs transformers for Llama- and Qwen3-shaped models, with
  the torch backend, Triton eager and Triton with CUDA graphs (the default on CUDA);
- bf16-agreement: greedy tokens vs transformers in bfloat16 with ``dtype: auto`` (not bit-exact:
  agreement rate and common prefixes; fails below 50%);
- perf <mode>: a Qwen3-0.6B-shaped model (random weights): prefill tokens/s and decode ms/step at
  batch 1, 32 and 256, for Triton + CUDA graphs, Triton eager and the torch backend;
- attention: our kernels vs dense SDPA, and decode's KV read rate vs the measured copy bandwidth;
- goals: the issue's targets (fp32 token-exact, decode b=256 >= 70% of copy bandwidth for the KV
  it reads, CUDA graphs >= 1.5x eager at batch 1).

The last line is ``SUMMARY``; the exit status is 1 when a stage failed. Stages that would start
after ``--deadline`` seconds are skipped (reported as SKIP), so the whole run stays in its slot.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--cpu", action="store_true", help="toy sizes on the CPU under TRITON_INTERPRET=1")
ARGS.add_argument("--deadline", type=float, default=420.0, help="skip stages that would start after this (s)")
OPTS = ARGS.parse_args()
if OPTS.cpu:
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton's jit

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams  # noqa: E402
from engine.config import EngineConfig  # noqa: E402

CPU = OPTS.cpu
DEV = "cpu" if CPU else "cuda"
TMP = Path(tempfile.mkdtemp(prefix="gpu-check-"))
START = time.perf_counter()
FAILED: list[str] = []
SKIPPED: list[str] = []
RESULTS: dict[str, object] = {}

TINY: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=384, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
QWEN3_06B: dict[str, Any] = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0)
QWEN3_TOY: dict[str, Any] = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, vocab_size=512, max_position_embeddings=512)
PERF_BATCHES = (1, 2) if CPU else (1, 32, 256)
PERF_CTX, PERF_STEPS = (16, 1) if CPU else (1024, 20)
PREFILL = (1, 16) if CPU else (32, 1024)  # prompts x tokens
PROMPT_LENS = (3, 21) if CPU else (3, 37, 16, 61, 9, 24, 130, 200)
GREEDY_TOKENS = 3 if CPU else 16  # on the CPU: prefill + 2 decode steps, each under the interpreter
PERF_WARM = 0 if CPU else 2  # untimed decode steps first (the interpreter compiles nothing)
PERF_TAIL = 1 if CPU else 3  # decode steps a perf request has left after the timed ones


def stage(name: str) -> Callable[[Callable[[], str]], None]:
    """Run ``fn`` now as stage ``name`` and print its one line."""

    def run(fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        if t0 - START > OPTS.deadline:
            SKIPPED.append(name)
            print(f"STAGE {name}: SKIP past the {OPTS.deadline:.0f}s deadline", flush=True)
            return
        try:
            status, detail = "ok", fn()
        except Exception as exc:  # a failing stage must not hide the later ones
            FAILED.append(name)
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
            traceback.print_exc(limit=8, file=sys.stderr)
        detail = " ".join(str(detail).split())[:900]
        print(f"STAGE {name}: {status} {detail} ({time.perf_counter() - t0:.1f}s)", flush=True)
        release()

    return run


def release() -> None:
    gc.collect()
    if not CPU:
        torch.cuda.empty_cache()


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """transformers >= 4.56 says ``dtype``; older ones only ``torch_dtype``."""
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def build(name: str, config: transformers.PretrainedConfig, dtype: torch.dtype) -> Path:
    """A seeded random checkpoint saved in ``dtype`` (made once per name)."""
    path = TMP / name
    if not path.exists():
        torch.manual_seed(0)
        with torch.device(DEV):
            model = transformers.AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype))
        model.save_pretrained(path)
        del model
        release()
    return path


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def hf_greedy(path: Path, ps: list[list[int]], n: int, dtype: torch.dtype) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, **_dtype_kwarg(dtype)).to(DEV).eval()
    out = []
    for p in ps:
        ids = torch.tensor([p], device=DEV)
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
        out.append(g[0, len(p):].tolist())
    del model
    release()
    return out


def engine_greedy(llm: LLM, ps: list[list[int]], n: int) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(ps, SamplingParams(temperature=0, max_tokens=n))]


# -- stages -------------------------------------------------------------------------------------


@stage("preflight")
def _preflight() -> str:
    import triton

    cc = [c for c in (os.environ.get("CC", ""), "gcc", "cc", "clang") if c and shutil.which(c)]
    info = (f"python {sys.version.split()[0]} torch {torch.__version__} triton {triton.__version__} "
            f"transformers {transformers.__version__} cc={cc or 'none'}")
    if not CPU:
        if not torch.cuda.is_available():
            raise RuntimeError(f"no CUDA device ({info})")
        p = torch.cuda.get_device_properties(0)
        info += (f" | {p.name} sm_{p.major}{p.minor} SMs={p.multi_processor_count} "
                 f"mem={p.total_memory / 2**30:.0f}GiB cuda {torch.version.cuda}")
        if not cc:
            raise RuntimeError(f"no C compiler: Triton cannot build its launcher ({info})")
    path = build("bf16-defaults", transformers.Qwen3Config(**TINY, head_dim=16), torch.bfloat16)
    cfg = EngineConfig(model=str(path), device=DEV)
    info += f" | auto -> attn_backend={cfg.attn_backend} dtype={str(cfg.torch_dtype).removeprefix('torch.')}"
    if not CPU and (cfg.attn_backend, cfg.torch_dtype) != ("triton", torch.bfloat16):
        raise RuntimeError(f"the GPU defaults are wrong: {info}")
    return info


@stage("kernels")
def _kernels() -> str:
    from bench.engine_gpu import random_paged_batch
    from engine.attention_metadata import AttentionMetadata
    from engine.kernels import paged_attention
    from engine.layers.attention import torch_paged_attention

    cases = [("mixed fp32 gqa4 d128", [(0, 19), (17, 1), (30, 6)], 8, 2, 128, torch.float32, None, None),
             ("mixed bf16 gqa8 d64", [(5, 1), (0, 12), (20, 20)], 8, 1, 64, torch.bfloat16, None, None),
             ("window fp32", [(20, 15), (33, 1)], 4, 1, 64, torch.float32, 9, None),
             ("decode bf16 splits=4", [(40, 1), (3, 1), (16, 1)], 4, 2, 128, torch.bfloat16, None, 4),
             ("decode bf16 splits=1", [(40, 1), (3, 1), (16, 1)], 4, 2, 128, torch.bfloat16, None, 1),
             ("decode fp32 default splits", [(70, 1)] * 5, 16, 8, 128, torch.float32, None, None)]
    out = []
    for name, specs, h_q, h_kv, d, dtype, window, splits in cases:
        q, cache, meta = random_paged_batch(specs, h_q, h_kv, d, dtype, DEV)
        empty = q.new_zeros(0, h_kv, d).float()
        no_write = AttentionMetadata(**{**meta.__dict__, "slot_mapping": meta.slot_mapping[:0], "plans": {}})
        want = torch_paged_attention(q.float(), empty, empty, cache.float(), no_write, d**-0.5, window)
        got = paged_attention(q, cache, meta, d**-0.5, window, out=torch.full_like(q, float("nan")),
                              num_splits=splits).float()
        err = ((got - want).abs().max() / (1.0 if dtype == torch.float32 else want.abs().max())).item()
        if got.isnan().any() or err > (1e-5 if dtype == torch.float32 else 2e-2):
            raise AssertionError(f"{name}: error {err:.1e}")
        out.append(f"{name} {err:.0e}")
    return "; ".join(out)


@stage("fp32-greedy")
def _fp32_greedy() -> str:
    archs = {"llama": transformers.LlamaConfig(**TINY, rope_scaling=LLAMA3_ROPE),
             "qwen3": transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=True)}
    done = []
    for arch, config in archs.items():
        path = build(f"fp32-{arch}", config, torch.float32)
        ps = prompts(TINY["vocab_size"])
        want = hf_greedy(path, ps, GREEDY_TOKENS, torch.float32)
        # The defaults (auto: Triton, CUDA graphs on CUDA) first, then Triton eager and torch. On the
        # CPU auto is the C++ kernel, so Triton (eager there) is checked under the "auto" label.
        modes: dict[str, dict[str, Any]] = {"auto": {"attn_backend": "triton"} if CPU else {},
                                               "triton-eager": {"attn_backend": "triton", "enforce_eager": True},
                                               "torch": {"attn_backend": "torch"}}
        if CPU:
            del modes["triton-eager"]
        for label, flags in modes.items():
            llm = LLM(str(path), device=DEV, dtype="float32", max_num_seqs=8, num_kv_blocks=256, **flags)
            graphs = llm.engine.runner.graphs is not None
            if label == "auto" and not CPU and not graphs:
                raise AssertionError(f"{arch}: the default CUDA run has no CUDA graphs")
            got = engine_greedy(llm, ps, GREEDY_TOKENS)
            if got != want:
                bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                raise AssertionError(f"{arch}/{label}: prompt {bad}: {got[bad]} != {want[bad]}")
            done.append(f"{arch}/{label}{'+graphs' if graphs else ''}")
            del llm
            release()
    RESULTS["fp32_exact"] = True
    return "token-exact: " + ", ".join(done)


@stage("bf16-agreement")
def _bf16() -> str:
    sizes = TINY if CPU else dict(TINY, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                  num_attention_heads=8, head_dim=64, vocab_size=4096, max_position_embeddings=2048)
    config = transformers.LlamaConfig(**sizes, initializer_range=0.1)
    path = build("bf16-llama", config, torch.bfloat16)
    ps = prompts(sizes["vocab_size"])
    want = hf_greedy(path, ps, 2 * GREEDY_TOKENS, torch.bfloat16)
    flags = {"dtype": "bfloat16", "attn_backend": "triton"} if CPU else {}  # on CUDA: the defaults
    llm = LLM(str(path), device=DEV, max_num_seqs=8, num_kv_blocks=256, **flags)
    if llm.engine.config.torch_dtype != torch.bfloat16:
        raise AssertionError(f"dtype auto gave {llm.engine.config.torch_dtype} for a bf16 checkpoint")
    got = engine_greedy(llm, ps, 2 * GREEDY_TOKENS)
    prefixes = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(got, want)]
    same = sum(a == b for x, y in zip(got, want) for a, b in zip(x, y)) / sum(map(len, want))
    detail = f"token agreement {same:.0%}, common prefixes {prefixes} of {2 * GREEDY_TOKENS}"
    if same < 0.5:  # rounding makes greedy paths part after a near-tie; far less means a bug
        raise AssertionError(detail)
    return detail


def perf(label: str, flags: dict[str, Any]) -> str:
    shape = QWEN3_TOY if CPU else QWEN3_06B
    dtype = torch.float32 if CPU else torch.bfloat16
    config = transformers.Qwen3Config(**shape, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    path = build("qwen3-06b", config, dtype)
    vocab = shape["vocab_size"]
    size = dict(max_num_batched_tokens=512, max_model_len=512, num_kv_blocks=512) if CPU else dict(
        max_num_batched_tokens=8192, max_model_len=2048, gpu_memory_utilization=0.35)
    llm = LLM(str(path), device=DEV, dtype="float32" if CPU else "auto", max_num_seqs=max(PERF_BATCHES),
              **size, **flags)
    engine = llm.engine
    n, plen = PREFILL
    once = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    if not CPU:  # warm-up (compiles; the interpreter has nothing to compile)
        llm.generate([[(j * 7) % vocab for j in range(plen)] for _ in range(2)], once)
    sync()
    t0 = time.perf_counter()
    llm.generate([[(i * 131 + j * 7 + 1) % vocab for j in range(plen)] for i in range(n)], once)
    sync()
    out = [f"graphs={engine.runner.graphs is not None} prefill {n * plen / (time.perf_counter() - t0):,.0f} tok/s"]
    steps: dict[int, float] = {}
    for b in PERF_BATCHES:
        # prefill's token + the warm-up steps + the timed ones + PERF_TAIL: nothing finishes while timed
        params = SamplingParams(temperature=0, max_tokens=1 + PERF_WARM + PERF_STEPS + PERF_TAIL, ignore_eos=True)
        for i in range(b):
            engine.add_request(f"{label}-{b}-{i}", [(i * 7919 + j * 3) % vocab for j in range(PERF_CTX)], params,
                               stream=False)
        while len(engine.scheduler.waiting) or any(s.is_prefilling for s in engine.scheduler.running):
            engine.step()
        for _ in range(PERF_WARM):
            engine.step()
        sync()
        t0 = time.perf_counter()
        for _ in range(PERF_STEPS):
            engine.step()
        sync()
        steps[b] = (time.perf_counter() - t0) / PERF_STEPS
        while engine.has_unfinished_requests():
            engine.step()
        out.append(f"b={b} {steps[b] * 1e3:.2f} ms/step ({b / steps[b]:,.0f} tok/s)")
    RESULTS[f"decode_{label}"] = steps
    del llm, engine
    return "; ".join(out)


stage("perf triton+graphs")(lambda: perf("graphs", {} if not CPU else {"attn_backend": "triton"}))
if not CPU:  # on the CPU the line above already ran Triton eagerly
    stage("perf triton eager")(lambda: perf("eager", {"attn_backend": "triton", "enforce_eager": True}))
stage("perf torch")(lambda: perf("torch", {"attn_backend": "torch"}))


def attention_case(b: int, ctx: int, q_len: int, bandwidth: float) -> str:
    """Our paged attention vs dense SDPA on one shape; decode also vs the copy bandwidth."""
    import torch.nn.functional as F

    from bench.engine_gpu import random_paged_batch, timer
    from engine.kernels import paged_attention

    shape = QWEN3_TOY if CPU else QWEN3_06B
    h_q, h_kv, d = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    dtype = torch.float32 if CPU else torch.bfloat16
    q, cache, meta = random_paged_batch([(ctx - q_len, q_len)] * b, h_q, h_kv, d, dtype, DEV)
    dst = torch.empty_like(q)
    ours = timer(lambda: paged_attention(q, cache, meta, d**-0.5, out=dst), DEV)
    qd = torch.randn(b, h_q, q_len, d, device=DEV, dtype=dtype)
    kd = torch.randn(b, h_kv, ctx, d, device=DEV, dtype=dtype)
    vd = torch.randn_like(kd)
    try:  # enable_gqa needs torch >= 2.5; older ones get the KV heads repeated
        F.scaled_dot_product_attention(qd[:1], kd[:1], vd[:1], is_causal=q_len > 1, enable_gqa=True)
    except TypeError:
        kd, vd = kd.repeat_interleave(h_q // h_kv, 1), vd.repeat_interleave(h_q // h_kv, 1)
    gqa = {"enable_gqa": True} if kd.shape[1] != h_q else {}
    sdpa = timer(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=q_len > 1, **gqa), DEV)
    line = f"{'decode' if q_len == 1 else 'prefill'} b={b} ctx={ctx}: ours {ours:.3f} ms, dense SDPA {sdpa:.3f} ms"
    if q_len == 1:
        frac = 2 * b * ctx * h_kv * d * cache.element_size() / (ours / 1e3) / bandwidth
        RESULTS[f"attn_bw_{b}"] = frac
        line += f", KV read at {frac:.0%} of copy bandwidth"
    return line


@stage("attention")
def _attention() -> str:
    from bench.engine_gpu import copy_bandwidth

    bandwidth = copy_bandwidth(DEV)
    cases = [(2, 32, 1), (1, 16, 16)] if CPU else [(256, 4096, 1), (32, 4096, 1), (1, 4096, 1), (4, 2048, 2048)]
    lines = [f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s"]
    for b, ctx, q_len in cases:
        lines.append(attention_case(b, ctx, q_len, bandwidth))
        release()
    return "; ".join(lines)


@stage("goals")
def _goals() -> str:
    top = max(PERF_BATCHES)
    graphs, eager = RESULTS.get("decode_graphs"), RESULTS.get("decode_eager")
    speedup = eager[1] / graphs[1] if isinstance(graphs, dict) and isinstance(eager, dict) else None
    bw = RESULTS.get(f"attn_bw_{top}", RESULTS.get("attn_bw_2"))
    lines = [f"fp32 token-exact: {'yes' if RESULTS.get('fp32_exact') else 'NO'}",
             f"decode b={top} KV read: {bw:.0%} of copy bandwidth (target >= 70%)" if isinstance(bw, float)
             else "decode KV read: n/a",
             f"graphs vs eager at b=1: {speedup:.2f}x (target >= 1.5x)" if speedup else "graphs vs eager: n/a"]
    if CPU:
        lines.append("(CPU interpreter run: timings mean nothing)")
    return "; ".join(lines)


shutil.rmtree(TMP, ignore_errors=True)
print("SUMMARY " + (f"FAILED: {', '.join(FAILED)}" if FAILED else "all stages ok")
      + (f"; skipped: {', '.join(SKIPPED)}" if SKIPPED else "")
      + f" ({time.perf_counter() - START:.0f}s)", flush=True)
sys.exit(1 if FAILED else 0)
