"""Sampler: masks against a plain reference, penalties, seeds, logprobs, banned tokens."""

from __future__ import annotations

import math

import torch

from engine.sampler import Sampler, SamplingRow, apply_min_p, apply_penalties, apply_top_k_top_p
from engine.sampling_params import SamplingParams

V = 50


def row(
    params: SamplingParams, prompt=(), output=(), seed_gen: torch.Generator | None = None, banned=()
) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(output), seed_gen, list(banned))


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def reference_keep(logits: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """Which tokens survive top_k, then top_p, then min_p, computed one row at a time."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kept = order[: top_k or len(order)]
    z = [math.exp(logits[i]) for i in kept]
    total = sum(z)
    nucleus, mass = [], 0.0
    for i, p in zip(kept, z):
        if mass > top_p:
            break
        nucleus.append(i)
        mass += p / total
    z2 = {i: math.exp(logits[i]) for i in nucleus}
    best = max(z2.values())
    return {i for i in nucleus if z2[i] >= min_p * best} if min_p else set(nucleus)


def test_top_k_top_p_min_p_masks_match_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, V) * 3
    settings = [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.5, 0.0), (10, 0.8, 0.0), (0, 1.0, 0.3), (8, 0.9, 0.1)]
    top_k = torch.tensor([s[0] for s in settings])
    top_p = torch.tensor([s[1] for s in settings])
    min_p = torch.tensor([s[2] for s in settings])
    masked = apply_min_p(apply_top_k_top_p(logits, top_k, top_p), min_p)
    for i, (k, p, mp) in enumerate(settings):
        got = set(torch.isfinite(masked[i]).nonzero().flatten().tolist())
        assert got == reference_keep(logits[i].tolist(), k, p, mp), settings[i]


def test_penalties_match_reference() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
    rows = [row(params, prompt=[1, 2], output=[2, 3, 3]), row(SamplingParams(), output=[4])]
    out = apply_penalties(logits.clone(), rows)
    expect = logits.clone()
    for t in (1, 2, 3):
        x = expect[0, t]
        expect[0, t] = x / 1.5 if x > 0 else x * 1.5
    expect[0, 2] -= 0.25 * 1 + 0.5
    expect[0, 3] -= 0.25 * 2 + 0.5
    assert torch.allclose(out, expect)


def test_greedy_is_argmax_and_banned_tokens_are_never_picked() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, V)
    best = logits.argmax(dim=-1)
    s = Sampler("cpu")
    greedy = SamplingParams(temperature=0)
    out = s(logits, [row(greedy), row(greedy, banned=[int(best[1])]), row(greedy)])
    assert out.token_ids[0] == best[0] and out.token_ids[2] == best[2]
    assert out.token_ids[1] != best[1]
    assert out.logprobs is None


def test_seeded_rows_reproduce_regardless_of_batch_mates() -> None:
    torch.manual_seed(3)
    logits = torch.randn(4, V)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=123)
    other = SamplingParams(temperature=0.7)

    def draws(batch: list[SamplingRow], target: int, sampler: Sampler) -> list[int]:
        return [sampler(logits[: len(batch)], batch).token_ids[target] for _ in range(20)]

    g_alone = gen(123)
    alone = draws([row(params, seed_gen=g_alone)], 0, Sampler("cpu", seed=0))
    g_mixed = gen(123)
    mates = [row(other), row(SamplingParams(temperature=0)), row(params, seed_gen=g_mixed), row(other)]
    # the target row is row 2 in the batch: give it the same logits as the lone run had
    logits[2] = logits[0]
    mixed = draws(mates, 2, Sampler("cpu", seed=99))
    assert alone == mixed
    assert len(set(alone)) > 1  # it really sampled


def test_sampling_stays_inside_the_filtered_set() -> None:
    torch.manual_seed(4)
    logits = torch.randn(1, V)
    allowed = set(logits[0].topk(3).indices.tolist())
    s = Sampler("cpu", seed=5)
    params = SamplingParams(temperature=2.0, top_k=3)
    seen = {s(logits, [row(params)]).token_ids[0] for _ in range(200)}
    assert seen <= allowed and len(seen) > 1


def test_a_temperature_past_float32_range_still_keeps_banned_tokens_out() -> None:
    """A temperature the wire takes (any finite float) above float32's range was inf in the
    sampler's tensor: a banned token's -inf / inf is NaN, and the draw picked banned tokens
    (logit_bias -100, min_tokens' stop tokens, a grammar's masked ones). It is as flat as can be."""
    torch.manual_seed(6)
    logits = torch.randn(1, V)
    allowed = {3, 17, 41}
    bias = {t: -100.0 for t in range(V) if t not in allowed}
    s = Sampler("cpu", seed=7)
    for temperature in (1e39, 1e300):
        params = SamplingParams(temperature=temperature, logit_bias=bias)
        seen = {s(logits, [row(params, banned=[17])]).token_ids[0] for _ in range(100)}
        assert seen == {3, 41}, (temperature, seen)


def test_draws_follow_the_tempered_distribution() -> None:
    """20,000 draws from a 6-token distribution at temperature 0.7: every frequency within 4
    standard errors of its probability."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    probs = (logits / 0.7).softmax(-1)[0].tolist()
    s = Sampler("cpu", seed=11)
    n = 20_000
    draws = s(logits.expand(n, -1), [row(SamplingParams(temperature=0.7))] * n).token_ids
    for token, p in enumerate(probs):
        freq = draws.count(token) / n
        assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-4, (token, freq, p)


def test_logprobs_are_raw_log_softmax_with_top_alternatives() -> None:
    torch.manual_seed(5)
    logits = torch.randn(2, V)
    ref = logits.log_softmax(dim=-1)
    s = Sampler("cpu")
    out = s(logits, [row(SamplingParams(temperature=0, logprobs=3)), row(SamplingParams(temperature=0))])
    assert out.logprobs is not None and out.top_ids is not None and out.top_logprobs is not None
    assert abs(out.logprobs[0] - ref[0].max().item()) < 1e-6
    assert out.top_ids[0] == ref[0].topk(3).indices.tolist()
    assert out.top_ids[1] == []  # row 1 did not ask for alternatives
    assert all(abs(a - b) < 1e-6 for a, b in zip(out.top_logprobs[0], ref[0].topk(3).values.tolist()))
