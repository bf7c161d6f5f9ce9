"""GPU benchmark: our engine (Triton attention, CUDA graphs) on the nano-vllm workload.

    python bench/engine_gpu.py                 # on a CUDA GPU, ~5-10 minutes
    python bench/engine_gpu.py --cpu-smoke     # CPU, Triton interpreter: correctness self-check + tiny run

Builds a Qwen3-0.6B-shaped model with random bf16 weights (no download), then:
1. the nano-vllm workload (256 sequences, prompt and output lengths uniform in 100-1024,
   ignore_eos): output tokens/s of our engine (Triton attention, CUDA graphs);
2. decode-step time at several batch sizes vs the HBM roofline: (weight bytes + KV bytes read per
   step) / measured device-to-device copy bandwidth;
3. kernel microbenchmarks: our paged attention vs torch SDPA on the same shapes
   (``triton.testing.do_bench``);
4. (our engine freed first) transformers' continuous batching on the same workload: the manager
   behind ``generate_batch``, fed each request's own max_new_tokens.
It prints a compact table last. ``--cpu-smoke`` first checks the kernels against the torch path
(exits 1 on a mismatch), then runs every part above at toy sizes so the script itself is tested.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.hf_baselines import continuous_batching
from engine import LLM, SamplingParams
from engine.attention_metadata import AttentionMetadata
from engine.kernels import paged_attention
from engine.layers.attention import torch_paged_attention


@dataclass
class Setup:
    device: str
    dtype: torch.dtype
    num_seqs: int
    len_range: tuple[int, int]
    decode_batches: tuple[int, ...]
    decode_ctx: int
    sizes: dict  # Qwen3 config fields
    max_model_len: int
    kv_blocks: int | None


QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)
TOY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=512,
           rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)

GPU = Setup("cuda", torch.bfloat16, 256, (100, 1024), (64, 128, 256), 1024, QWEN3_06B, 4096, None)
SMOKE = Setup("cpu", torch.float32, 4, (3, 6), (2,), 20, TOY, 512, 256)  # interpreter steps are slow: few


def timer(fn: Callable[[], object], device: str) -> float:
    """Milliseconds per call: do_bench on a GPU, a short wall-clock loop otherwise."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=50))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# -- correctness self-check -------------------------------------------------------------------

def random_paged_batch(specs: list[tuple[int, int]], h_q: int, h_kv: int, d: int, dtype: torch.dtype,
                       device: str, block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(q, kv_cache with every context's K/V written, metadata) for (cached, new) sequences."""
    blocks_per = [-(-(c + n) // block_size) for c, n in specs]
    perm = torch.randperm(sum(blocks_per)).tolist()
    tables, slots, ofs = [], [], 0
    for (c, n), nb in zip(specs, blocks_per):
        blocks = perm[ofs : ofs + nb]
        ofs += nb
        tables.append(blocks + [0] * (max(blocks_per) - nb))
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(c, c + n))
    cache = torch.randn(2, sum(blocks_per), block_size, h_kv, d, device=device).to(dtype)
    q_lens = torch.tensor([n for _, n in specs])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        context_lens=torch.tensor([c + n for c, n in specs], dtype=torch.int32, device=device),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(torch.int32).to(device),
        max_query_len=int(q_lens.max()),
        max_context_len=max(c + n for c, n in specs),
        block_size=block_size,
    )
    q = torch.randn(int(q_lens.sum()), h_q, d, device=device).to(dtype)
    return q, cache, meta


def self_check(device: str) -> list[tuple[str, str]]:
    """Our kernels vs the torch reference on mixed, prefix-cached and decode batches."""
    rows = []
    cases = [("mixed fp32 gqa4 d128", [(0, 19), (17, 1), (30, 6)], 8, 2, 128, torch.float32, None),
             ("mixed bf16 gqa8 d64", [(5, 1), (0, 12), (20, 20)], 8, 1, 64, torch.bfloat16, None),
             ("split decode bf16 gqa2 d128", [(40, 1), (3, 1), (16, 1)], 4, 2, 128, torch.bfloat16, 4)]
    for name, specs, h_q, h_kv, d, dtype, splits in cases:
        q, cache, meta = random_paged_batch(specs, h_q, h_kv, d, dtype, device)
        empty_kv = q.new_zeros(0, h_kv, d)
        skip = AttentionMetadata(**{**meta.__dict__, "slot_mapping": meta.slot_mapping[:0], "plans": {}})
        want = torch_paged_attention(q.float(), empty_kv.float(), empty_kv.float(), cache.float(), skip, d**-0.5, None)
        out = torch.full_like(q, float("nan"))
        got = paged_attention(q, cache, meta, d**-0.5, out=out, num_splits=splits).float()
        err = ((got - want).abs().max() / (1.0 if dtype == torch.float32 else want.abs().max())).item()
        ok = not got.isnan().any() and err <= (1e-5 if dtype == torch.float32 else 2e-2)
        rows.append((f"check: {name}", f"{'ok' if ok else 'FAIL'} (err {err:.1e})"))
        if not ok:
            print("\n".join(f"{k}: {v}" for k, v in rows))
            raise SystemExit(1)
    return rows


# -- the workload -----------------------------------------------------------------------------

def build_model(path: Path, setup: Setup) -> None:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**setup.sizes, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(setup.device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=setup.dtype)
    model.save_pretrained(path)
    del model


def workload(setup: Setup, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    lo, hi = setup.len_range
    vocab = setup.sizes["vocab_size"]
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(setup.num_seqs)]
    return prompts, [rng.randint(lo, hi) for _ in range(setup.num_seqs)]


def make_llm(path: Path, setup: Setup, backend: str = "triton", max_num_seqs: int | None = None) -> LLM:
    extra = {"num_kv_blocks": setup.kv_blocks} if setup.kv_blocks else {}
    return LLM(str(path), dtype=setup.dtype, device=setup.device, attn_backend=backend,
               max_model_len=setup.max_model_len, max_num_seqs=max_num_seqs or setup.num_seqs,
               max_num_batched_tokens=max(setup.max_model_len, 8192 if setup.device == "cuda" else 512), **extra)


def run_ours(llm: LLM, prompts: list[list[int]], outputs: list[int], device: str) -> tuple[float, int, list]:
    if device == "cuda":  # warm-up (compiles; the CPU smoke's interpreter has nothing to compile)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
    sync(device)
    t0 = time.perf_counter()
    results = llm.generate(prompts, params)
    sync(device)
    elapsed = time.perf_counter() - t0
    tokens = [r.outputs[0].token_ids for r in results]
    assert sum(map(len, tokens)) == sum(outputs)
    return elapsed, sum(outputs), tokens


def release(device: str) -> None:
    """Give freed GPU memory (a dropped engine's KV cache) back, so the next system gets it."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_hf(path: Path, prompts: list[list[int]], outputs: list[int], setup: Setup) -> tuple[float, int] | None:
    """transformers continuous batching (what ``generate_batch`` drives), per-request lengths."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=setup.dtype).to(setup.device).eval()
    try:
        return continuous_batching(model, prompts, outputs, timeout=120)
    finally:
        del model


# -- decode steps vs the HBM roofline -------------------------------------------------------------

def copy_bandwidth(device: str) -> float:
    """Bytes/s of a large device copy (read + write)."""
    n = (1 << 30) if device == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), device)
    return 2 * n / (ms / 1e3)


def decode_step_time(llm: LLM, batch: int, ctx: int, setup: Setup, steps: int, warm: int = 2) -> tuple[float, int]:
    """Mean seconds per decode-only step with ``batch`` sequences at about ``ctx`` tokens (after
    ``warm`` untimed steps), and the KV bytes read in the mean step."""
    engine = llm.engine
    vocab = setup.sizes["vocab_size"]
    # prefill's token + warm-up + timed steps + one more: nothing finishes while timed
    params = SamplingParams(temperature=0, max_tokens=1 + warm + steps + 1, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"decode-{batch}-{i}", [(i * 7 + j) % vocab for j in range(ctx)], params, stream=False)
    sched = engine.scheduler
    while len(sched.waiting) or any(s.is_prefilling for s in sched.running):  # all prompts in the cache
        engine.step()
    for _ in range(warm):
        engine.step()
    sync(setup.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(setup.device)
    elapsed = (time.perf_counter() - t0) / steps
    while engine.has_unfinished_requests():
        engine.step()
    mean_ctx = ctx + warm + steps // 2
    return elapsed, batch * mean_ctx * engine.runner.layout.bytes_per_token


def weight_bytes(llm: LLM) -> int:
    seen, total = set(), 0
    for p in llm.engine.runner.model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


# -- kernel microbenchmarks -------------------------------------------------------------------------

def kernel_bench(setup: Setup) -> list[tuple[str, float, float]]:
    """(shape, ours ms, SDPA ms) for a decode batch and a prefill batch at the model's head shape."""
    import torch.nn.functional as F

    cfg = setup.sizes
    h_q, h_kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    dev, dt = setup.device, setup.dtype
    big = dev == "cuda"
    shapes = [
        ("decode", 64 if big else 2, 1024 if big else 32, 1),
        ("prefill", 4 if big else 1, 512 if big else 16, None),
    ]
    rows = []
    for name, b, length, q_len in shapes:
        q_len = q_len or length
        q, cache, meta = random_paged_batch([(length - q_len, q_len)] * b, h_q, h_kv, d, dt, dev)
        out = torch.empty_like(q)
        ours = timer(lambda: paged_attention(q, cache, meta, d**-0.5, out=out), dev)  # noqa: B023 (called here)
        qd = torch.randn(b, h_q, q_len, d, device=dev, dtype=dt)
        kd = torch.randn(b, h_kv, length, d, device=dev, dtype=dt)
        vd = torch.randn_like(kd)
        causal = q_len > 1
        sdpa = timer(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=True), dev)  # noqa: B023
        rows.append((f"{name} b={b} ctx={length} q={q_len}", ours, sdpa))
    return rows


# -- main -------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, Triton interpreter, toy sizes")
    ap.add_argument(
        "--skip-hf",
        action="store_true",
        help="skip the transformers baseline (always skipped by --cpu-smoke: its manager takes ~45 s "
        "to start on CPU; bench/engine_cpu.py runs the same baseline there)",
    )
    ap.add_argument("--decode-steps", type=int, default=None, help="timed decode steps per batch (20; smoke 1)")
    args = ap.parse_args()
    args.skip_hf = args.skip_hf or args.cpu_smoke
    args.decode_steps = args.decode_steps or (1 if args.cpu_smoke else 20)
    setup = SMOKE if args.cpu_smoke else GPU
    if setup.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke on a CPU")
    table: list[tuple[str, str]] = self_check(setup.device)
    prompts, outputs = workload(setup)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path, setup)
        release(setup.device)
        llm = make_llm(path, setup)
        t, n, ours_tokens = run_ours(llm, prompts, outputs, setup.device)
        ours_tps = n / t
        table.append(("workload", f"{len(prompts)} seqs, {sum(map(len, prompts))} prompt / {n} output tokens"))
        table.append(("ours: output tok/s", f"{ours_tps:,.0f} ({t:.1f} s)"))
        bw = copy_bandwidth(setup.device)
        wbytes = weight_bytes(llm)
        table.append(("copy bandwidth", f"{bw / 1e9:,.0f} GB/s; weights {wbytes / 1e9:.2f} GB"))
        for batch in setup.decode_batches:
            step_s, kv_bytes = decode_step_time(llm, batch, setup.decode_ctx, setup, args.decode_steps,
                                                warm=0 if args.cpu_smoke else 2)
            frac = (wbytes + kv_bytes) / step_s / bw
            table.append(
                (
                    f"decode step b={batch} ctx~{setup.decode_ctx}",
                    f"{step_s * 1e3:.2f} ms, {frac:.0%} of copy bandwidth (target >= 70% for b >= 64)",
                )
            )
        del llm
        release(setup.device)
        for shape, ours_ms, sdpa_ms in kernel_bench(setup):
            table.append(
                (
                    f"attention {shape}",
                    f"ours {ours_ms:.3f} ms, SDPA {sdpa_ms:.3f} ms, ratio {ours_ms / sdpa_ms:.2f}x (target <= 1.2x)",
                )
            )
        if args.cpu_smoke:  # the Triton path must agree with the torch path token for token
            ref = make_llm(path, setup, backend="torch")
            same = run_ours(ref, prompts, outputs, setup.device)[2] == ours_tokens
            table.append(("check: triton == torch greedy tokens", "ok" if same else "FAIL"))
            if not same:
                print("\n".join(f"{k}: {v}" for k, v in table))
                raise SystemExit(1)
            del ref
            release(setup.device)
        if not args.skip_hf:
            try:
                hf = run_hf(path, prompts, outputs, setup)
            except Exception as exc:  # the baseline failing must not hide our numbers
                table.append(("transformers continuous batching", f"failed: {type(exc).__name__}: {exc}"[:160]))
            else:
                if hf is None:
                    table.append(("transformers continuous batching", "n/a (no init_continuous_batching)"))
                else:
                    table.append(("transformers continuous batching: tok/s", f"{hf[1] / hf[0]:,.0f} ({hf[0]:.1f} s)"))
                    table.append(("ours / transformers", f"{ours_tps / (hf[1] / hf[0]):.2f}x (target >= 2x)"))
    if args.cpu_smoke:
        table.append(("note", "CPU smoke run: interpreter timings mean nothing"))
    width = max(len(k) for k, _ in table)
    print(f"\n{'metric':<{width}}  value\n{'-' * width}  {'-' * 5}")
    print("\n".join(f"{k:<{width}}  {v}" for k, v in table))


if __name__ == "__main__":
    main()
