"""Structured output cost: decode step time at batch 1 and 32 with and without a JSON-schema
constraint, grammar compile time per schema, and whether the cache makes the second request free.

    python bench/structured_output.py [--model PATH] [--steps 32] [--repeats 5]

Without --model the seeded tiny model is built in a temporary folder (CPU); ``--model default``
takes the default model (SmolLM2-135M GGUF, vocabulary 49152). Free and constrained runs are
interleaved ``--repeats`` times and each cell is the median over the runs of a run's median step,
so a busy shared machine skews both sides alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


def step_time(llm: LLM, batch: int, steps: int, constrained: bool) -> float:
    engine = llm.engine
    so = StructuredOutput("json", json.dumps(LONG)) if constrained else None
    for i in range(batch):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=steps + 8, ignore_eos=True, structured=so)
        engine.add_request(f"r{i}-{constrained}-{batch}", "Hello there", params)
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    decode = times[2:2 + steps]  # past the prefill
    return statistics.median(decode) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.model == "default":
        from backends.local.default_model import default_model_path

        args.model = str(default_model_path())
    model = args.model or str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0))
    llm = LLM(model, num_kv_blocks=1024, max_model_len=512, max_num_seqs=64)
    step_time(llm, 1, 4, False)  # warm up
    step_time(llm, 1, 4, True)
    print(f"model: {model}")
    print("| batch | free step (ms) | JSON-schema step (ms) | added |")
    print("|---|---|---|---|")
    for batch in (1, 32):
        free_runs, constrained_runs = [], []
        for _ in range(args.repeats):
            free_runs.append(step_time(llm, batch, args.steps, False))
            constrained_runs.append(step_time(llm, batch, args.steps, True))
        free, constrained = statistics.median(free_runs), statistics.median(constrained_runs)
        print(f"| {batch} | {free:.2f} | {constrained:.2f} | {100 * (constrained / free - 1):+.1f}% |")
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
