"""Batched, vectorised sampling on the logits' device.

Order of operations per row: penalties (repetition on prompt + output, presence/frequency on
output), the min_tokens ban on stop tokens, logit_bias, the grammar's token bitmask, then greedy
argmax (also for a temperature below ``SAMPLING_EPS``), or temperature, top_k, top_p and min_p and
a draw. Draws use the exponential race (argmax of p / q, q ~ Exp(1)), with q taken from the row's
own torch.Generator when the request has a seed, so a seeded row gives the same tokens whatever
else is in the batch.
Logprobs are those of the raw model distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SAMPLING_EPS, SamplingParams
from engine.structured_output import apply_bitmask

_NEG_INF = float("-inf")
_FLOAT_MAX = torch.finfo(torch.float32).max
_FLOAT_TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32
_PENALISED_MAX = _FLOAT_MAX * SAMPLING_EPS / 2  # a penalised logit's bound: finite after any temperature


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    banned_ids: list[int]  # token ids masked this step (stop tokens before min_tokens)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float] | None  # of the sampled tokens, when any row asked
    top_ids: list[list[int]] | None  # per row, trimmed to the row's own ``logprobs``
    top_logprobs: list[list[float]] | None


def join_rows(parts: list[SamplerOutput | None]) -> SamplerOutput:
    """One-row outputs as the batch's output; a failed row (None) gets token -1 and no logprobs."""
    want = any(p is not None and p.logprobs is not None for p in parts)
    tokens = [p.token_ids[0] if p is not None else -1 for p in parts]
    if not want:
        return SamplerOutput(tokens, None, None, None)
    return SamplerOutput(
        tokens,
        [p.logprobs[0] if p is not None and p.logprobs else 0.0 for p in parts],
        [p.top_ids[0] if p is not None and p.top_ids else [] for p in parts],
        [p.top_logprobs[0] if p is not None and p.top_logprobs else [] for p in parts],
    )


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)


def _held_in_range(x: torch.Tensor, mask: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Each row's ``factor`` for its ``mask``ed entries of ``x`` (finite logits), held where the
    largest of them scaled stays a normal float32 and within ``_PENALISED_MAX``: scaled, they stay
    apart from the rest and in the order exact arithmetic gives them, instead of tying at inf (or
    NaN once a temperature divides them) or at 0. A factor of 1 is never moved."""
    largest = torch.where(mask, x.abs(), 0.0).amax(dim=1, keepdim=True).clamp_min(_FLOAT_TINY)
    return factor.clamp(min=_FLOAT_TINY / largest, max=_PENALISED_MAX / largest)


def apply_repetition_penalty(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """A seen token's positive logit divided by the row's penalty, a negative one multiplied (as
    vLLM and transformers). The wire takes any positive finite penalty, also past float32's range
    (1e-300, 1e300), so the seen logits are scaled in float64 by a factor held in float32's range
    (``_held_in_range``): finite, in exact arithmetic's order, as far from the rest as float32 goes."""
    n, vocab = logits.shape
    dev = logits.device
    ids = _padded([r.prompt_ids + r.output_ids for r in rows], vocab, dev)  # padding: an extra 0 column
    padded = torch.cat([logits, logits.new_zeros(n, 1)], dim=1)
    x = padded.gather(1, ids).double()
    rep = torch.tensor([r.params.repetition_penalty for r in rows], dtype=torch.float64, device=dev)[:, None]
    up, down = x > 0, x < 0
    x = torch.where(up, x * _held_in_range(x, up, 1.0 / rep), torch.where(down, x * _held_in_range(x, down, rep), x))
    return padded.scatter(1, ids, x.to(logits.dtype))[:, :vocab]


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    n, vocab = logits.shape
    dev = logits.device
    pres = torch.tensor([r.params.presence_penalty for r in rows], device=dev)
    freq = torch.tensor([r.params.frequency_penalty for r in rows], device=dev)
    out_ids = _padded([r.output_ids for r in rows], vocab, dev)
    counts = torch.zeros(n, vocab + 1, device=dev)
    counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=counts.dtype))
    counts = counts[:, :vocab]
    if any(r.params.repetition_penalty != 1.0 for r in rows):
        logits = apply_repetition_penalty(logits, rows)
    return logits - freq[:, None] * counts - pres[:, None] * (counts > 0).to(logits.dtype)


def apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """OpenAI's logit_bias: added to the logits; -100 bans the token outright. A few tensor
    operations a row, however many tokens it biases (a request may bias the whole vocabulary)."""
    logits = logits.clone()
    for i, r in enumerate(rows):
        if r.params.logit_bias:
            ids, bias, banned = (t.to(logits.device, non_blocking=True) for t in r.params.bias_tensors)
            logits[i, ids] += bias.to(logits.dtype)
            logits[i, banned] = _NEG_INF
    return logits


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask the logits below each row's ``top_k``-th largest (tokens tied with it stay), then all
    outside the ``top_p`` nucleus: the most likely tokens until their mass reaches ``top_p``, the
    one that crosses it included, a token after the mass has reached it exactly not (as vLLM and
    transformers). ``top_k`` 0 and ``top_p`` 1 disable a row's filter; the best token is always kept."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab)
        kth = sorted_logits.gather(1, (k - 1)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, _NEG_INF)
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        at_or_below = probs.flip(-1).cumsum(dim=-1).flip(-1)  # the token's mass and all after it
        drop = at_or_below <= 1.0 - top_p[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, _NEG_INF)


def _exponential(shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Exp(1) noise for the exponential race (``argmax(p / q)`` draws from ``p``): ``-log(1 - u)``,
    several times faster than ``Tensor.exponential_`` on the CPU. A zero draw (u = 0) is lifted
    to the smallest normal float, so ``p / q`` stays finite and masked tokens stay at 0."""
    u = torch.rand(shape, generator=generator, device=device)
    return torch.log1p(u.neg_()).neg_().clamp_min_(torch.finfo(torch.float32).tiny)


class Sampler:
    def __init__(self, device: torch.device | str, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow],
                 bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """``bitmask`` (int32, one row of 32-token words per row; all ones for a free row) holds
        the tokens each row's grammar allows (``engine.structured_output``)."""
        logits = logits.float()
        max_k = max((r.params.logprobs for r in rows if r.params.logprobs is not None), default=None)
        raw_logprobs = logits.log_softmax(dim=-1) if max_k is not None else None

        if any(r.params.needs_penalties for r in rows):
            logits = apply_penalties(logits, rows)
        vocab = logits.shape[-1]  # ids off the vocabulary are refused on entry; never index with one
        banned = [(i, t) for i, r in enumerate(rows) for t in r.banned_ids if 0 <= t < vocab]
        if banned:
            logits = logits.clone()
            ri, ti = zip(*banned)
            logits[list(ri), list(ti)] = _NEG_INF
        if any(r.params.logit_bias for r in rows):
            logits = apply_logit_bias(logits, rows)
        if bitmask is not None:
            logits = apply_bitmask(logits, bitmask)

        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if random_rows:
            tokens = self._draw(logits, rows, random_rows, tokens)

        token_list = tokens.tolist()
        if raw_logprobs is None:
            return SamplerOutput(token_list, None, None, None)
        sampled = raw_logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        top_vals, top_ids = raw_logprobs.topk(min(max_k, raw_logprobs.shape[-1]), dim=-1) if max_k else (None, None)
        ids_l: list[list[int]] = []
        vals_l: list[list[float]] = []
        all_ids = top_ids.tolist() if top_ids is not None else None
        all_vals = top_vals.tolist() if top_vals is not None else None
        for i, r in enumerate(rows):
            k = r.params.logprobs or 0
            ids_l.append(all_ids[i][:k] if all_ids and k else [])
            vals_l.append(all_vals[i][:k] if all_vals and k else [])
        return SamplerOutput(token_list, sampled, ids_l, vals_l)

    def _draw(
        self, logits: torch.Tensor, rows: list[SamplingRow], idx: list[int], tokens: torch.Tensor
    ) -> torch.Tensor:
        dev = logits.device
        sub_rows = [rows[i] for i in idx]
        index = torch.tensor(idx, device=dev)
        sub = logits.index_select(0, index)
        # A temperature past float32's range (the wire takes any finite one) would be inf, and a
        # masked token's -inf / inf NaN: float32's largest flattens the row just as far.
        # float32 whatever Python type came in: a batch of int temperatures (``temperature=1``) was an
        # integer tensor that cannot be clamped or divide in place, and every such request failed.
        temps = [r.params.temperature for r in sub_rows]
        temp = torch.tensor(temps, dtype=torch.float32, device=dev).clamp_(SAMPLING_EPS, _FLOAT_MAX)
        sub = sub / temp[:, None]
        vocab = logits.shape[-1]
        top_k = [k if 0 < k < vocab else 0 for k in (r.params.top_k for r in sub_rows)]  # k >= vocab: all
        top_p = [r.params.top_p for r in sub_rows]
        if any(top_k) or any(p < 1.0 for p in top_p):
            sub = apply_top_k_top_p(
                sub,
                torch.tensor(top_k, device=dev) if any(top_k) else None,
                torch.tensor(top_p, device=dev) if any(p < 1.0 for p in top_p) else None,
            )
        min_p = [r.params.min_p for r in sub_rows]
        if any(min_p):
            sub = apply_min_p(sub, torch.tensor(min_p, device=dev))
        probs = sub.softmax(dim=-1)
        q = _exponential(probs.shape, self.generator, dev)
        for j, r in enumerate(sub_rows):
            if r.generator is not None:
                q[j] = _exponential(probs.shape[1:], r.generator, dev)
        drawn = (probs / q).argmax(dim=-1)
        tokens = tokens.clone()
        tokens[index] = drawn
        return tokens
