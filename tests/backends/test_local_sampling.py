"""Sampling parameters and completion semantics on the built-in engine, as vLLM's OpenAI server
answers them, through the gateway with the openai SDK: ``n`` and ``seed``, stop strings and stop
token ids (also streamed), ``min_tokens``, ``ignore_eos``, ``logit_bias``, the filters' edge values,
batches of prompts and the exact usage."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.tokenizer import Tokenizer
from tests.support.local_gateway import Env, local_gateway

PROMPT = "The quick brown fox"
EOS = "1"  # the tiny model's <|end_of_text|>, as a logit_bias key


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("sampling"), max_model_len=64) as s:
        yield s


def _complete(env: Env, **kw: Any) -> Any:
    return env.client().completions.create(model="tiny", prompt=kw.pop("prompt", PROMPT), **kw)


def _texts(answer: Any) -> list[str]:
    return [c.text for c in answer.choices]


def test_n_choices_differ_and_a_seed_repeats_them_whatever_the_batch(env: Env) -> None:
    first = _texts(_complete(env, max_tokens=8, n=3, seed=11))
    assert len(set(first)) == 3
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(_complete, env, prompt=f"other {i}", max_tokens=12) for i in range(3)]
        again = pool.submit(_complete, env, max_tokens=8, n=3, seed=11)
        assert _texts(again.result()) == first
        [o.result() for o in others]
    streamed = ["", "", ""]
    for chunk in _complete(env, max_tokens=8, n=3, seed=11, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == first
    assert _texts(_complete(env, max_tokens=8, n=3, seed=11, logprobs=2)) == first  # logprobs draw nothing


def test_seed_minus_one_is_no_seed(env: Env) -> None:
    """vLLM's ``seed: -1`` means unseeded: repeated requests sample afresh, not the same text."""
    answers = {_complete(env, max_tokens=8, seed=-1).choices[0].text for _ in range(4)}
    assert len(answers) > 1


def test_batched_prompts_take_indexes_p_times_n_plus_i_and_exact_usage(env: Env) -> None:
    tok = Tokenizer(env.folder)
    prompts = ["ab", "cd ef"]
    answer = _complete(env, prompt=prompts, n=2, max_tokens=3)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert answer.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert answer.usage.completion_tokens == 4 * 3
    ids = [tok.encode(p) for p in prompts]
    by_ids = _complete(env, prompt=ids, max_tokens=3, temperature=0)
    assert _texts(by_ids) == _texts(_complete(env, prompt=prompts, max_tokens=3, temperature=0))
    chunks = list(_complete(env, prompt=prompts, n=2, max_tokens=3, stream=True,
                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    assert sorted(c.index for k in chunks for c in k.choices if c.finish_reason) == [0, 1, 2, 3]


def test_stop_strings_cut_the_text_streamed_or_not(env: Env) -> None:
    greedy = _complete(env, max_tokens=12, temperature=0).choices[0].text
    stop = greedy[4:7]  # spans tokens
    cut = greedy[: greedy.find(stop)]
    whole = _complete(env, max_tokens=12, temperature=0, stop=["never", stop]).choices[0]
    assert (whole.text, whole.finish_reason, whole.stop_reason) == (cut, "stop", stop)
    chunks = [c for k in _complete(env, max_tokens=12, temperature=0, stop=[stop], stream=True) for c in k.choices]
    assert "".join(c.text for c in chunks) == cut
    assert [(c.finish_reason, c.stop_reason) for c in chunks if c.finish_reason] == [("stop", stop)]
    first = _complete(env, max_tokens=12, temperature=0, stop=[greedy[:1]]).choices[0]
    assert (first.text, first.stop_reason) == ("", greedy[:1])
    stops = [greedy[4:7], greedy[3:5]]  # they overlap: the earliest in the text wins
    overlapping = _complete(env, max_tokens=12, temperature=0, stop=stops).choices[0]
    assert overlapping.text == greedy[: min(greedy.find(s) for s in stops)]
    assert _complete(env, max_tokens=12, temperature=0, stop=[greedy[-2:] + "zz"]).choices[0].text == greedy


def test_eos_stop_token_ids_min_tokens_and_ignore_eos(env: Env) -> None:
    eos = _complete(env, max_tokens=8, logit_bias={EOS: 100})
    assert (eos.choices[0].finish_reason, eos.choices[0].stop_reason, eos.usage.completion_tokens) == ("stop", None, 1)
    late = _complete(env, max_tokens=8, logit_bias={EOS: 100}, extra_body={"min_tokens": 3})
    assert (late.choices[0].finish_reason, late.usage.completion_tokens) == ("stop", 4)
    ignored = _complete(env, max_tokens=8, logit_bias={EOS: 100}, extra_body={"ignore_eos": True})
    assert (ignored.choices[0].finish_reason, ignored.usage.completion_tokens) == ("length", 8)
    token = _complete(env, max_tokens=8, logit_bias={"50": 100}, extra_body={"stop_token_ids": [50], "min_tokens": 2})
    assert (token.choices[0].finish_reason, token.choices[0].stop_reason, token.usage.completion_tokens) == (
        "stop", 50, 3)


@pytest.mark.parametrize("extra", [{"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}])
def test_filters_at_their_edge_are_greedy(env: Env, extra: dict[str, Any]) -> None:
    greedy = _complete(env, max_tokens=8, temperature=0).choices[0].text
    assert _complete(env, max_tokens=8, temperature=1.5, extra_body=extra).choices[0].text == greedy
    assert _complete(env, max_tokens=8, temperature=1e-7).choices[0].text == greedy


def test_top_k_minus_one_and_zero_disable_it(env: Env) -> None:
    plain = _complete(env, max_tokens=6, seed=3).choices[0].text
    assert _complete(env, max_tokens=6, seed=3, extra_body={"top_k": -1}).choices[0].text == plain
    assert _complete(env, max_tokens=6, seed=3, extra_body={"top_k": 0}).choices[0].text == plain


def test_logit_bias_forces_and_bans(env: Env) -> None:
    tok = Tokenizer(env.folder)
    assert _complete(env, max_tokens=3, logit_bias={"60": 100}).choices[0].text == tok.decode([60] * 3)
    only = {str(i): -100 for i in range(1024) if i != 61}
    assert _complete(env, max_tokens=3, logit_bias=only).choices[0].text == tok.decode([61] * 3)


@pytest.mark.parametrize("kw, param", [
    ({"logit_bias": {"abc": 5}}, "logit_bias"),
    ({"logit_bias": {"100000": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"top_p": 0}, "top_p"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"min_tokens": 9}}, "min_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"max_tokens": 60}, "max_tokens"),  # the prompt's 6 tokens + 60 > the context of 64
])
def test_out_of_range_values_are_a_400_naming_the_field(env: Env, kw: dict[str, Any], param: str) -> None:
    kw = {"max_tokens": 8, **kw}
    with pytest.raises(openai.BadRequestError) as caught:
        _complete(env, **kw)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_repetition_penalty_above_two_is_taken(env: Env) -> None:
    """vLLM bounds repetition_penalty below only (> 0)."""
    answer = _complete(env, max_tokens=4, temperature=0, extra_body={"repetition_penalty": 3.0})
    assert answer.usage.completion_tokens == 4


def test_the_context_limit(env: Env) -> None:
    exact = _complete(env, prompt=[7] * 60, max_tokens=4)
    assert (exact.usage.prompt_tokens, exact.usage.completion_tokens) == (60, 4)
    with pytest.raises(openai.BadRequestError) as caught:
        _complete(env, prompt=[7] * 64, max_tokens=1)
    assert caught.value.body["param"] == "prompt"  # type: ignore[index]
