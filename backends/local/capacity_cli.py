"""``switchyard engine capacity``: what a GPU holds for a model, from its config alone."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def capacity(
    model: Annotated[str, typer.Option("--model", help="Local HF model folder or its config.json.")],
    gpu_memory_gb: Annotated[float, typer.Option("--gpu-memory-gb", help="GPU memory in GB (decimal).")] = 80.0,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    avg_tokens: Annotated[int, typer.Option("--avg-tokens", help="Average tokens per sequence (paged).")] = 2000,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", help="Default: the model's maximum.")]
    = None,
    reserve_cap: Annotated[int, typer.Option("--reserve-cap", help="Tokens reserved per sequence when capped.")]
    = 8192,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="Default (auto): as the engine runs it on a GPU, the checkpoint's bfloat16/float16 "
        "(bfloat16 for a float32 checkpoint).",
    )] = None,
    block_size: Annotated[int, typer.Option("--block-size")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Weights, KV bytes per token, tokens that fit and concurrent sequences (full-context
    reservation, capped reservation, paged allocation)."""
    from engine.capacity.plan import format_plan, plan_as_dict, plan_capacity

    try:
        plan = plan_capacity(model, gpu_memory_gb, gpu_memory_utilization, dtype, block_size, avg_tokens,
                             max_model_len, reserve_cap)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(plan_as_dict(plan)) if as_json else format_plan(plan, gpu_memory_gb, gpu_memory_utilization))
