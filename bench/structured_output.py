"""Structured output cost: decode step time at batch 1 and 32 with and without a JSON-schema
constraint, grammar compile time per schema, and whether the cache makes the second request free.

    python bench/structured_output.py [--model PATH] [--steps 32] [--repeats 5] [--threads N]

Without --model the seeded tiny model is built in a temporary folder (CPU); ``--model default``
takes the default model (SmolLM2-135M GGUF, vocabulary 49152). Free and constrained runs are
run on two engines with the same weights, stepped alternately (``--repeats`` runs of ``--steps``
decode steps), so a busy shared machine skews both sides alike; the last column is the median of
the per-step ratios. ``--threads`` sets torch's CPU threads (1 is the steadiest on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine import LLM, SamplingParams
from engine.structured_output import StructuredOutput, StructuredOutputManager
from engine.tiny_model import build_tiny_model

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id", "name"]}}, "required": ["user"]},
    "array": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
              "required": ["xs"]},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    "required": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"},
                                                  "c": {"type": "null"}}, "required": ["a", "b", "c"]},
    "bounds": {"type": "object", "properties": {"n": {"type": "number", "minimum": -5, "maximum": 5},
                                                "k": {"type": "integer", "minimum": 0, "maximum": 100}},
               "required": ["n", "k"]},
}
# A long-running constraint for step timing: an array of many integers keeps every row decoding.
LONG = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}


def _start(llm: LLM, batch: int, steps: int, so: StructuredOutput | None, tag: str) -> None:
    for i in range(batch):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=steps + 8, ignore_eos=True, structured=so)
        llm.engine.add_request(f"{tag}{i}", "Hello there", params)


def _timed_step(llm: LLM) -> float:
    t = time.perf_counter()
    llm.engine.step()
    return time.perf_counter() - t


def paired_steps(free: LLM, constrained: LLM, batch: int, steps: int) -> tuple[list[float], list[float]]:
    """Decode step times (ms) of ``batch`` free rows on one engine and ``batch`` JSON-schema rows on
    another (same weights), stepped alternately so both see the same load on a shared machine."""
    _start(free, batch, steps, None, "f")
    _start(constrained, batch, steps, StructuredOutput("json", json.dumps(LONG)), "c")
    for _ in range(2):  # the prefill
        free.engine.step()
        constrained.engine.step()
    a, b = [], []
    for _ in range(steps):
        a.append(_timed_step(free) * 1000)
        b.append(_timed_step(constrained) * 1000)
    for llm in (free, constrained):
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model == "default":
        from backends.local.default_model import default_model_path

        args.model = str(default_model_path())
    model = args.model or str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0))
    llm = LLM(model, num_kv_blocks=1024, max_model_len=512, max_num_seqs=64)
    other = LLM(model, num_kv_blocks=1024, max_model_len=512, max_num_seqs=64)
    paired_steps(llm, other, 1, 4)  # warm up
    print(f"model: {model}, torch threads: {torch.get_num_threads()}")
    print("| batch | free step (ms) | JSON-schema step (ms) | added (ratio of medians) | added (median paired ratio) |")
    print("|---|---|---|---|---|")
    for batch in (1, 32):
        free_ms: list[float] = []
        constrained_ms: list[float] = []
        for _ in range(args.repeats):
            a, b = paired_steps(llm, other, batch, args.steps)
            free_ms += a
            constrained_ms += b
        free, constrained = statistics.median(free_ms), statistics.median(constrained_ms)
        paired = statistics.median(c / f for f, c in zip(free_ms, constrained_ms, strict=True))
        print(f"| {batch} | {free:.2f} | {constrained:.2f} | {100 * (constrained / free - 1):+.1f}% "
              f"| {100 * (paired - 1):+.1f}% |")
    tok = llm.engine.tokenizer
    assert tok is not None
    manager = StructuredOutputManager(tok.path, tok.vocab_size, sorted(tok.eos_token_ids))
    print()
    print("| schema | first compile (ms) | second (ms, cached) | matcher (ms) |")
    print("|---|---|---|---|")
    for name, schema in SCHEMAS.items():
        so = StructuredOutput("json", json.dumps(schema))
        t0 = time.perf_counter()
        manager.compile(so)
        t1 = time.perf_counter()
        manager.compile(StructuredOutput("json", json.dumps(schema)))
        t2 = time.perf_counter()
        manager.matcher(so)
        t3 = time.perf_counter()
        print(f"| {name} | {(t1 - t0) * 1000:.2f} | {(t2 - t1) * 1000:.3f} | {(t3 - t2) * 1000:.2f} |")


if __name__ == "__main__":
    main()
