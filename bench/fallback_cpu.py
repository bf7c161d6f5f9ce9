"""CPU benchmark of the transformers fallback on a non-native architecture (GPT-NeoX):
the HF modules inside our engine (model_impl=transformers) vs the plain-generate backend
(provider ``transformers``: worker thread, batches of compatible requests), vs static
``generate`` batches. Same workload as bench/engine_cpu.py.

    .venv/bin/python bench/fallback_cpu.py           # 64 requests, prompts 32-256, outputs 16-256

Every request ignores EOS, so each system produces exactly the requested number of tokens.
On a CPU shared with other work, prefer ``--threads 1``: OpenMP threads spinning against other
processes distort the many small ops of a decode step far more than one big batched op.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_cpu import run_static, workload, workload_args

from backends.openai_wire import CompletionRequest
from backends.transformers_generate import load_generate_backend
from engine import LLM, SamplingParams
from engine.tiny_model import write_tokenizer


def build_model(path: Path, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(
        hidden_size=args.hidden, intermediate_size=args.hidden * 2, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, vocab_size=args.vocab, max_position_embeddings=1024,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    cfg.architectures = ["GPTNeoXForCausalLM"]
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    write_tokenizer(path, 1024)  # the serving path needs a tokenizer; prompts are token ids anyway


def run_in_engine(
    path: Path, prompts: list[list[int]], outputs: list[int], args: argparse.Namespace
) -> tuple[float, int]:
    llm = LLM(
        str(path),
        model_impl="transformers",
        block_size=args.block_size,
        num_kv_blocks=args.kv_blocks,
        max_model_len=1024,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=args.max_batched_tokens,
    )
    assert llm.engine.model_impl == "transformers"
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outputs]
    t0 = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(r.outputs[0].token_ids) for r in results)
    assert tokens == sum(outputs)
    return elapsed, tokens


def run_plain_backend(path: Path, prompts: list[list[int]], outputs: list[int], batch: int) -> tuple[float, int]:
    async def go() -> tuple[float, int]:
        backend = load_generate_backend(str(path), "bench", {"max_batch_size": batch, "max_queue": len(prompts)})
        try:

            def request(p: list[int], n: int) -> CompletionRequest:
                return CompletionRequest(model="bench", prompt=p, max_tokens=n, temperature=0.0, ignore_eos=True)

            await backend.complete(request(prompts[0][:8], 2))  # warm-up
            t0 = time.perf_counter()
            done = await asyncio.gather(*(backend.complete(request(p, o)) for p, o in zip(prompts, outputs)))
            elapsed = time.perf_counter() - t0
        finally:
            await backend.aclose()
        tokens = sum(r.meter.completion_tokens for r in done)
        assert tokens == sum(outputs)
        return elapsed, tokens

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_args(ap, "rows per generate call (plain backend and static)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts, outputs = workload(args)
    print(
        f"model: GPT-NeoX hidden={args.hidden} layers={args.layers} heads={args.heads} vocab={args.vocab}, "
        f"float32, {args.threads} threads; {len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
        f"output tokens {sum(outputs)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path, args)
        rows = [
            ("fallback inside the engine (model_impl=transformers)", *run_in_engine(path, prompts, outputs, args)),
            (
                f"plain generate backend (batches of <= {args.hf_batch})",
                *run_plain_backend(path, prompts, outputs, args.hf_batch),
            ),
            (
                f"transformers generate (static batches of {args.hf_batch})",
                *run_static(path, prompts, outputs, args.hf_batch),
            ),
        ]
    first = rows[0][2] / rows[0][1]
    print("\n| system | time (s) | output tok/s | in-engine / this |\n|---|---:|---:|---:|")
    for name, t, n in rows:
        print(f"| {name} | {t:.2f} | {n / t:.0f} | {first / (n / t):.2f}x |")


if __name__ == "__main__":
    main()
