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
    """Which tokens survive top_k (ties with the k-th kept), then top_p (until the mass reaches it),
    then min_p, computed one row at a time as vLLM and transformers define them."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kth = logits[order[min(top_k or len(order), len(order)) - 1]]
    kept = [i for i in order if logits[i] >= kth]
    z = [math.exp(logits[i]) for i in kept]
    total = sum(z)
    nucleus, mass = [], 0.0
    for i, p in zip(kept, z):
        if mass >= top_p:
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


def test_a_tiny_repetition_penalty_lifts_the_best_seen_token_as_far_as_float32_goes() -> None:
    """A repetition_penalty below float32's range (the wire takes any positive float) was 0 in the
    sampler's tensor: a seen positive logit / 0 is inf, and inf - inf NaN, so the answer was
    garbage. In exact arithmetic a seen token's positive logit grows past every other one, the
    largest most: the penalised logits stay finite and in that order, a seen negative one near 0."""
    logits = torch.tensor([[5.0, 1.0, 3.0, -2.0, 9.0, 0.0, -0.5]])
    seen = [2, 1, 3, 5]  # positive 3.0 and 1.0, negative -2.0, zero
    s = Sampler("cpu", seed=8)
    for penalty in (1e-30, 1e-38, 1e-45, 1e-300, 5e-324):
        params = SamplingParams(repetition_penalty=penalty)
        out = apply_penalties(logits.clone(), [row(params, prompt=seen)])
        assert torch.isfinite(out).all(), (penalty, out)
        x = out[0].tolist()
        assert x[2] > x[1] > 9.0 * 1e20 and x[0] == 5.0 and x[4] == 9.0 and x[6] == -0.5, (penalty, x)
        assert -1e-20 < x[3] <= 0.0 and x[5] == 0.0, (penalty, x)
        for temperature in (0.0, 1e-5, 0.5, 1.0, 100.0):
            picked = {s(logits, [row(SamplingParams(repetition_penalty=penalty, temperature=temperature),
                                     prompt=seen)]).token_ids[0] for _ in range(20)}
            assert picked == {2}, (penalty, temperature, picked)


def test_a_huge_repetition_penalty_sinks_seen_tokens_in_order_without_nan() -> None:
    """A repetition_penalty past float32's range was inf: a seen zero logit * inf is NaN. Exactly,
    a seen positive logit shrinks to 0 and a seen negative one sinks below every other, the most
    negative lowest: finite, in that order, even when every token has been seen."""
    logits = torch.tensor([[5.0, 1.0, 3.0, -2.0, 9.0, 0.0, -0.5]])
    everything = list(range(7))
    s = Sampler("cpu", seed=9)
    for penalty in (1e30, 1e39, 1e300, 1.7e308):
        params = SamplingParams(repetition_penalty=penalty)
        out = apply_penalties(logits.clone(), [row(params, prompt=[0, 3, 5, 6])])
        x = out[0].tolist()
        assert torch.isfinite(out).all(), (penalty, out)
        assert 0.0 <= x[0] < 1e-20 and x[5] == 0.0 and (x[1], x[2], x[4]) == (1.0, 3.0, 9.0), (penalty, x)
        assert x[3] < x[6] < -1e20, (penalty, x)
        out = apply_penalties(logits.clone(), [row(params, prompt=everything)])
        assert torch.isfinite(out).all(), (penalty, out)
        order = out[0].argsort(descending=True).tolist()
        assert order[:3] == [4, 0, 2] and order[-2:] == [6, 3], (penalty, order)
        picked = {s(logits, [row(SamplingParams(repetition_penalty=penalty, temperature=0.0),
                                 prompt=[4, 0, 2, 1, 3])]).token_ids[0] for _ in range(5)}
        assert picked == {4}, (penalty, picked)  # 9 / penalty: still above the unseen 0 and -0.5


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


def test_top_k_keeps_the_tokens_tied_with_the_kth() -> None:
    """vLLM and transformers mask the logits below the k-th largest: a token tied with it stays
    (ties are common in bf16 logits). The ranks cut a tie at random instead."""
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, 0.0]])
    for k, expect in ((1, {0, 2}), (2, {0, 2}), (3, {0, 2, 3, 4}), (4, {0, 2, 3, 4}), (5, {0, 1, 2, 3, 4})):
        masked = apply_top_k_top_p(logits, torch.tensor([k]), None)
        assert set(torch.isfinite(masked[0]).nonzero().flatten().tolist()) == expect, k


def test_top_p_stops_once_the_mass_reaches_it_and_keeps_the_crossing_token() -> None:
    """The nucleus is the most likely tokens until their mass reaches ``top_p``: four equal tokens
    at top_p 0.5 keep two (the mass before the third is exactly 0.5), at 0.6 three (the third
    crosses it), as vLLM and transformers; a row with top_p 1 beside them keeps everything."""
    logits = torch.zeros(4, 4)
    masked = apply_top_k_top_p(logits, None, torch.tensor([0.5, 0.6, 0.25, 1.0]))
    assert torch.isfinite(masked).sum(dim=1).tolist() == [2, 3, 1, 4]
    s = Sampler("cpu", seed=12)
    n = 4000
    draws = s(logits[:1].expand(n, -1), [row(SamplingParams(top_p=0.5))] * n).token_ids
    assert len(set(draws)) == 2


def _chi_square_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """The upper tail of Pearson's chi-square for ``counts`` against ``expected`` (both > 0)."""
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor((counts.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """softmax(logits / T), then top_k, top_p and min_p, one token at a time in float64."""
    probs = (logits.double() / temperature).softmax(-1)
    kept = set(reference_keep((logits.double() / temperature).tolist(), top_k, top_p, min_p))
    out = torch.tensor([float(probs[i]) if i in kept else 0.0 for i in range(logits.numel())], dtype=torch.float64)
    return out / out.sum()


def test_draws_follow_the_filtered_distribution_for_every_setting() -> None:
    """40,000 draws a setting from a fixed row with ties: no token outside the reference's support,
    and the counts pass a chi-square test against it at p > 1e-6 (seeded: the same draws every run)."""
    logits = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.5, 0.0, 0.0, -1.0, -3.0])
    settings = [(0.5, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (2.0, 0, 1.0, 0.0), (1.0, 2, 1.0, 0.0), (1.0, 3, 1.0, 0.0),
                (1.0, 0, 0.6, 0.0), (2.0, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.2), (1.5, 6, 0.9, 0.1), (0.7, 4, 0.7, 0.3)]
    s = Sampler("cpu", seed=13)
    n = 40_000
    for temperature, top_k, top_p, min_p in settings:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        draws = torch.tensor(s(logits.expand(n, -1), [row(params)] * n).token_ids)
        counts = torch.bincount(draws, minlength=logits.numel()).double()
        ref = reference_probs(logits, temperature, top_k, top_p, min_p)
        support = ref > 0
        assert counts[~support].sum() == 0, (temperature, top_k, top_p, min_p, counts)
        if support.sum() > 1:
            p = _chi_square_p(counts[support], ref[support] * n)
            assert p > 1e-6, (temperature, top_k, top_p, min_p, p, counts)


def test_an_integer_temperature_samples() -> None:
    """``SamplingParams(temperature=1)`` (an int, as Python callers write it) made the batch's
    temperatures an integer tensor: clamping it raised, and every such request failed."""
    torch.manual_seed(14)
    logits = torch.randn(2, V)
    for temps in ((1,), (1, 2)):
        rows = [row(SamplingParams(temperature=t, seed=3), seed_gen=gen(3)) for t in temps]
        floats = [row(SamplingParams(temperature=float(t), seed=3), seed_gen=gen(3)) for t in temps]
        got = Sampler("cpu")(logits[: len(temps)], rows).token_ids
        assert got == Sampler("cpu")(logits[: len(temps)], floats).token_ids
