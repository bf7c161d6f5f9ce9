"""Embeddings: a request that pools its prompt's final hidden states instead of generating.

As vLLM's pooling models: the prompt is prefilled (chunked, batched with generating requests by the
same scheduler) and, at its last position, the final-layer hidden states (after the model's last
norm) are pooled, ``last`` token or ``mean`` over every position, and L2-normalised by default.
Mean pooling needs every position to run through the model, so such a sequence takes no blocks
from the prefix cache (``Sequence.computes_whole_prompt``); its running sum restarts when a
preempted sequence is recomputed from the beginning.
"""

from __future__ import annotations

import torch

from engine.scheduler import ScheduledSeq


def pool_step(hidden: torch.Tensor, scheduled: list[ScheduledSeq], query_starts: list[int]) -> dict[int, list[float]]:
    """Fold this step's hidden states into every pooling sequence; the embeddings of those whose
    prompt this step completes, by ``seq_id``."""
    done: dict[int, list[float]] = {}
    for item, row0 in zip(scheduled, query_starts):
        seq = item.seq
        params = seq.pooling
        if params is None:
            continue
        rows = hidden[row0 : row0 + item.num_new_tokens].float()
        if params.pooling == "mean":
            chunk_sum = rows.sum(dim=0)
            running = seq.pool_sum
            seq.pool_sum = chunk_sum if running is None or seq.num_computed_tokens == 0 else running + chunk_sum
        if not item.samples:
            continue
        if params.pooling == "last":
            pooled = rows[-1]
        else:
            assert seq.pool_sum is not None
            pooled = seq.pool_sum / seq.num_prompt_tokens
        if params.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=0)
        seq.pool_sum = None
        done[seq.seq_id] = pooled.tolist()
    return done
