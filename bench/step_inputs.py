"""Host time to build one decode step's inputs: the old full rebuild vs ``StepInputBuilder``.

    PYTHONPATH=. python bench/step_inputs.py [--device cuda]

The rebuild is what the model runner did before: every block table padded into a list of lists
and sent with ``torch.tensor`` (plus one tensor per field). The builder sends only new blocks
(none in most decode steps) from pinned buffers. Prints ms per step for a few batch x context
sizes; on the CPU it measures the host work alone.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence
from engine.step_inputs import StepInputBuilder

BLOCK = 16


def decode_batch(num_seqs: int, ctx: int) -> list[ScheduledSeq]:
    blocks = -(-(ctx + 1) // BLOCK)
    out = []
    for i in range(num_seqs):
        seq = Sequence(f"r{i}", [1] * (ctx + 1), SamplingParams(max_tokens=1))
        seq.block_table = list(range(i * blocks, (i + 1) * blocks))
        seq.num_computed_tokens = ctx
        out.append(ScheduledSeq(seq, 1))
    return out


def rebuild(scheduled: list[ScheduledSeq], device: torch.device) -> list[torch.Tensor]:
    """What the model runner did before, for a decode-only step: lists, padded tables, 7 tensors."""
    ids, positions, slots, context_lens, query_start, sample_rows = [], [], [], [], [0], []
    for item in scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        ids.append(seq.token_ids[start])
        positions.append(start)
        slots.append(seq.block_table[start // BLOCK] * BLOCK + start % BLOCK)
        query_start.append(query_start[-1] + 1)
        context_lens.append(start + 1)
        sample_rows.append(query_start[-1] - 1)
    width = max(len(item.seq.block_table) for item in scheduled)
    tables = [item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in scheduled]
    longs = [torch.tensor(x, dtype=torch.long, device=device) for x in (ids, positions, slots, sample_rows)]
    ints = [torch.tensor(x, dtype=torch.int32, device=device) for x in (tables, context_lens, query_start)]
    return longs + ints


def per_step_ms(fn: Callable[[], object], device: torch.device, reps: int = 5) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="32x4096,256x4096,256x32768", help="batch x context, comma separated")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"{'batch x ctx':>14}  {'rebuild ms':>10}  {'builder ms':>10}")
    for size in args.sizes.split(","):
        b, ctx = (int(x) for x in size.split("x"))
        scheduled = decode_batch(b, ctx)
        builder = StepInputBuilder(device, b, -(-(ctx + 1) // BLOCK), BLOCK)
        old = per_step_ms(lambda: rebuild(scheduled, device), device)  # noqa: B023 (called here)
        new = per_step_ms(lambda: builder.build(scheduled), device)  # noqa: B023 (called here)
        print(f"{size:>14}  {old:>10.2f}  {new:>10.2f}")


if __name__ == "__main__":
    main()
