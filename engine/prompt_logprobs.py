"""Logprobs of the prompt's own tokens (vLLM's ``prompt_logprobs``), computed in the prefill.

The hidden state at position ``p`` predicts token ``p + 1``, so a prefill chunk over positions
``[start, end)`` yields the logprobs of prompt tokens ``start + 1 .. end`` (the last prompt
position predicts the first output token: that one is sampled, not scored). Chunked prefill
fills them chunk by chunk; after a preemption the recomputed positions are skipped. A sequence
that wants them never takes prompt blocks from the prefix cache (``Sequence.computes_whole_prompt``),
since cached positions would not run through the model. The values are those of the raw model
distribution, as the sampler's logprobs; each carries its token's rank in the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.scheduler import ScheduledSeq
from engine.sequence import TokenLogprob


def compute_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    scheduled: list[ScheduledSeq],
    query_starts: list[int],
) -> dict[int, list[TokenLogprob]]:
    """The new prompt logprobs of every scheduled sequence that wants them, by ``seq_id``, in
    prompt order, continuing ``seq.prompt_logprobs``."""
    found: dict[int, list[TokenLogprob]] = {}
    for item, row0 in zip(scheduled, query_starts):
        seq = item.seq
        known = seq.prompt_logprobs
        if known is None:
            continue
        start = seq.num_computed_tokens
        first = max(start, len(known) - 1)  # the first position whose next token has no logprob yet
        last = min(start + item.num_new_tokens, seq.num_prompt_tokens - 1)  # exclusive
        if first >= last:
            continue
        rows = hidden[row0 + first - start : row0 + last - start]
        logprobs = compute_logits(rows).float().log_softmax(dim=-1)
        targets = torch.tensor(seq.prompt_token_ids[first + 1 : last + 1], device=logprobs.device)
        picked = logprobs.gather(1, targets[:, None])
        chosen = picked.squeeze(1).tolist()
        ranks = (logprobs >= picked).sum(dim=-1).tolist()  # vLLM's rank: ties count against the token
        k = seq.params.prompt_logprobs or 0
        top_ids: list[list[int]] = [[] for _ in chosen]
        top_vals: list[list[float]] = [[] for _ in chosen]
        if k:
            values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
            top_ids, top_vals = ids.tolist(), values.tolist()
        found[seq.seq_id] = [
            TokenLogprob(token, value, dict(zip(ids_i, vals_i)), rank)
            for token, value, ids_i, vals_i, rank in zip(targets.tolist(), chosen, top_ids, top_vals, ranks)
        ]
    return found
