"""CPU benchmark: our engine vs transformers generate (static batches) vs transformers
continuous batching (generate_batch's manager), same seeded random Llama, same workload.

    .venv/bin/python bench/engine_cpu.py            # 64 requests, prompts 32-256, outputs 16-256
    .venv/bin/python bench/engine_cpu.py --threads 1 --repeat 2   # steadier on a shared CPU

Prints output tokens/s, the ratios, and our KV utilisation (tokens held / slots allocated,
averaged over steps). Every request ignores EOS (the model has none), so all systems produce
exactly the requested number of tokens; a static batch runs to its longest member and only the
requested tokens count as output.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.hf_baselines import continuous_batching
from engine import LLM, SamplingParams
from engine.metrics import EngineMetrics


def build_model(path: Path, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        vocab_size=args.vocab,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)


def workload_args(ap: argparse.ArgumentParser, hf_batch_help: str) -> None:
    """The options of the seeded random model and workload (``build_model``, ``workload``), the
    engine's KV cache and batch, transformers' batch (``--hf-batch``), and the CPU threads."""
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=2048)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--hf-batch", type=int, default=16, help=hf_batch_help)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)


def workload(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(args.vocab) for _ in range(rng.randint(32, 256))] for _ in range(args.num_requests)]
    outputs = [rng.randint(16, 256) for _ in range(args.num_requests)]
    return prompts, outputs


def watch_overallocation(llm: LLM) -> list[int]:
    """Slots allocated beyond each running sequence's last partially filled block, per step (what
    an allocator could waste on top of the block granularity; 0 means none)."""
    engine, extra = llm.engine, []
    record, bs = engine._record_step, engine.config.block_size

    def record_and_check() -> None:
        running = engine.scheduler.running
        extra.append(sum((len(s.block_table) - -(-s.num_computed_tokens // bs)) * bs for s in running))
        record()

    engine._record_step = record_and_check  # type: ignore[method-assign]
    return extra


def run_ours(
    path: Path, prompts: list[list[int]], outputs: list[int], args: argparse.Namespace
) -> tuple[float, int, float]:
    llm = LLM(
        str(path),
        block_size=args.block_size,
        num_kv_blocks=args.kv_blocks,
        max_model_len=1024,
        max_num_seqs=args.num_requests,
        max_num_batched_tokens=args.max_batched_tokens,
    )
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    llm.engine.metrics = EngineMetrics()
    extra = watch_overallocation(llm)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
    t0 = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    assert tokens == sum(outputs)
    assert not any(extra), "slots allocated beyond the last block of a sequence"
    return elapsed, tokens, llm.engine.get_metrics().kv_token_utilization


def run_static(path: Path, prompts: list[list[int]], outputs: list[int], batch: int) -> tuple[float, int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generate(torch.tensor([prompts[0][:8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            group, wants = prompts[i : i + batch], outputs[i : i + batch]
            width = max(len(p) for p in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            n = max(wants)
            model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
            )
    return time.perf_counter() - t0, sum(outputs)


def run_continuous(path: Path, prompts: list[list[int]], outputs: list[int]) -> tuple[float, int] | None:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return continuous_batching(model, prompts, outputs, timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_args(ap, "static batch size for transformers generate")
    ap.add_argument("--repeat", type=int, default=1, help="runs per system; the best time counts")
    ap.add_argument("--skip", nargs="*", default=[], choices=["static", "continuous"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts, outputs = workload(args)
    print(
        f"model: Llama hidden={args.hidden} layers={args.layers} heads={args.heads} vocab={args.vocab}, float32, "
        f"{args.threads} threads; {len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
        f"output tokens {sum(outputs)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path, args)
        best: dict[str, tuple[float, int]] = {}
        util = 0.0
        for _ in range(args.repeat):  # interleaved, best of N: the CPU may be shared
            t, n, util = run_ours(path, prompts, outputs, args)
            best["ours"] = min(best.get("ours", (t, n)), (t, n))
            if "static" not in args.skip:
                t, n = run_static(path, prompts, outputs, args.hf_batch)
                best["static"] = min(best.get("static", (t, n)), (t, n))
            if "continuous" not in args.skip:
                res = run_continuous(path, prompts, outputs)
                if res is not None:
                    best["continuous"] = min(best.get("continuous", res), res)
        names = {
            "ours": "switchyard engine",
            "static": f"transformers generate (static batches of {args.hf_batch})",
            "continuous": "transformers continuous batching",
        }
        rows = [(names[k], *v) for k, v in best.items()]
    ours = rows[0][2] / rows[0][1]
    print("\n| system | time (s) | output tok/s | ours / this |\n|---|---:|---:|---:|")
    for name, t, n in rows:
        print(f"| {name} | {t:.2f} | {n / t:.0f} | {ours / (n / t):.2f}x |")
    print(
        f"\nKV utilisation (tokens held / slots allocated, mean over steps): {util * 100:.1f}% "
        f"(block_size={args.block_size}); every unused slot is in the unfilled tail of a sequence's "
        f"last block"
    )


if __name__ == "__main__":
    main()
