"""transformers baselines shared by the engine benchmarks."""

from __future__ import annotations

import time

import torch
import transformers


def continuous_batching(
    model: torch.nn.Module, prompts: list[list[int]], outputs: list[int], timeout: float = 60.0
) -> tuple[float, int] | None:
    """Run transformers' continuous batching (what ``generate_batch`` drives) with per-request lengths.

    Returns (seconds, output tokens), or None when this transformers version has no such manager.
    """
    if not hasattr(model, "init_continuous_batching"):
        return None
    gen_cfg = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=max(outputs), eos_token_id=None, pad_token_id=0
    )
    manager = model.init_continuous_batching(generation_config=gen_cfg)
    manager.start()
    try:
        t0 = time.perf_counter()
        for p, o in zip(prompts, outputs):
            manager.add_request(p, max_new_tokens=o)
        done, tokens = 0, 0
        while done < len(prompts):
            result = manager.get_result(timeout=timeout)
            if result is None:
                raise RuntimeError("transformers continuous batching stopped answering")
            if result.is_finished():
                done += 1
                tokens += len(result.generated_tokens)
        return time.perf_counter() - t0, tokens
    finally:
        manager.stop(block=True)
