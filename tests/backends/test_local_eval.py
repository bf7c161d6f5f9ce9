"""Scoring prompts through the gateway as evaluation harnesses do: ``echo`` + ``logprobs`` returns the
prompt tokens' logprobs, also with ``max_tokens: 0``, equal to transformers' own loglikelihoods.

vLLM's ``prompt_logprobs``, with the openai SDK: one entry per prompt token (the first null), each the
prompt token with its rank and the ``k`` most likely tokens, equal to a full forward of the same
weights in transformers, on text and chat completions, also for a prompt whose prefix the cache
holds; refused with ``stream`` (as vLLM) and past the cap of 20 (vLLM's -1, the whole vocabulary, too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.tokenizer import Tokenizer
from tests.support.local_gateway import Env, local_gateway

PROMPT = "Trains run on rails between the stations of the old city"
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about trains."}]

# A small multiple-choice set: (context, choices, index of the answer the model is scored on).
QUESTIONS = [
    ("Question: What colour is the sky on a clear day?\nAnswer:", [" blue", " green", " red"]),
    ("Question: How many legs does a spider have?\nAnswer:", [" eight", " six", " four", " ten"]),
    ("The capital of France is", [" Paris", " Rome", " Berlin"]),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("eval"), enable_prefix_caching=True) as served:
        yield served


@pytest.fixture(scope="module")
def reference(env: Env) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(env.folder), dtype=torch.float32).eval()


def _encode_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's split: the whole string's tokens, the context's prefix of them."""
    whole = tok.encode(context + continuation, add_special_tokens=False)
    context_ids = tok.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids):]


def _harness_score(client: openai.OpenAI, context_ids: list[int], continuation_ids: list[int],
                   max_tokens: int) -> tuple[float, bool]:
    """What ``local-completions`` sends for a loglikelihood request, and how it reads the answer."""
    answer = client.completions.create(model="tiny", prompt=context_ids + continuation_ids, max_tokens=max_tokens,
                                       logprobs=1, echo=True, temperature=0, seed=1234)
    lp = answer.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    end = len(lp.token_logprobs) - max_tokens  # the generated token, if any, is not the continuation's
    scored = lp.token_logprobs[len(context_ids):end]
    tops = lp.top_logprobs[len(context_ids):end]
    assert len(scored) == len(continuation_ids)
    greedy = all(value == max(top.values()) for value, top in zip(scored, tops))  # type: ignore[union-attr]
    return float(sum(scored)), greedy  # type: ignore[arg-type]


def _transformers_score(model: Any, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0].float().log_softmax(dim=-1)
    positions = range(len(context_ids), ids.shape[1])
    total = sum(logprobs[p - 1, ids[0, p]].item() for p in positions)
    greedy = all(int(logprobs[p - 1].argmax()) == int(ids[0, p]) for p in positions)
    return total, greedy


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_multiple_choice_scores_equal_transformers_loglikelihoods(env: Env, reference: Any, max_tokens: int) -> None:
    tok = Tokenizer(env.folder)
    client = env.client()
    for context, choices in QUESTIONS:
        ours, theirs = [], []
        for choice in choices:
            context_ids, continuation_ids = _encode_pair(tok, context, choice)
            score, greedy = _harness_score(client, context_ids, continuation_ids, max_tokens)
            want, want_greedy = _transformers_score(reference, context_ids, continuation_ids)
            assert score == pytest.approx(want, abs=1e-4) and greedy == want_greedy
            ours.append(score)
            theirs.append(want)
        assert max(range(len(ours)), key=ours.__getitem__) == max(range(len(theirs)), key=theirs.__getitem__)
    env.wait_idle()


def test_scoring_only_generates_and_meters_nothing(env: Env) -> None:
    env.usage.records.clear()
    answer = env.client().completions.create(model="tiny", prompt="The capital of France is Paris", max_tokens=0,
                                             logprobs=0, echo=True)
    choice = answer.choices[0]
    assert choice.text == "The capital of France is Paris" and choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.tokens or []) == answer.usage.prompt_tokens
    assert answer.usage is not None and answer.usage.completion_tokens == 0
    record = env.usage.wait_for(1)[-1]
    assert record.completion_tokens == 0 and record.prompt_tokens == answer.usage.prompt_tokens
    env.wait_idle()


def test_streamed_echo_carries_the_same_prompt_logprobs(env: Env) -> None:
    client = env.client()
    args: dict[str, Any] = {"model": "tiny", "prompt": "Trains run on rails", "max_tokens": 4, "logprobs": 2,
                            "echo": True, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**args)
    parts = [p.choices[0] for p in client.completions.create(stream=True, **args) if p.choices]
    assert "".join(p.text for p in parts) == whole.choices[0].text
    streamed = [v for p in parts if p.logprobs for v in (p.logprobs.token_logprobs or [])]
    assert whole.choices[0].logprobs is not None
    assert streamed == pytest.approx(whole.choices[0].logprobs.token_logprobs)
    env.wait_idle()


def test_a_prompt_as_long_as_the_context_is_scored(env: Env) -> None:
    """lm-evaluation-harness's rolling loglikelihood (perplexity) sends windows of exactly the
    model's context with ``max_tokens: 0``: scored as vLLM scores them; one more token to generate
    has no room (a 400 naming max_tokens), and a prompt past the context none at all."""
    client, context = env.client(), env.backend.max_model_len
    tokens = [(7 * i) % 200 + 5 for i in range(context)]
    answer = client.completions.create(model="tiny", prompt=tokens, max_tokens=0, echo=True, logprobs=1)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and answer.usage.completion_tokens == 0
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == context
    assert answer.usage.prompt_tokens == context
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=tokens, max_tokens=1, echo=True, logprobs=1)
    assert refused.value.param in ("max_tokens", "prompt")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[*tokens, 5], max_tokens=0, echo=True, logprobs=1)
    env.wait_idle()


def test_prompt_logprobs_ignore_a_warm_prefix_cache(env: Env) -> None:
    """A second scoring of the same prompt finds its blocks cached but still computes every position."""
    client = env.client()
    prompt = "A long shared prefix about railways and their many stations. " * 4
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, logprobs=1, echo=True)
    client.completions.create(model="tiny", prompt=prompt, max_tokens=3)  # a plain request warms the cache
    second = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, logprobs=1, echo=True)
    assert first.choices[0].logprobs is not None and second.choices[0].logprobs is not None
    assert second.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs
    env.wait_idle()


# ---------------------------------------------------------------- vLLM's prompt_logprobs


def assert_matches_reference(env: Env, model: Any, ids: list[int], entries: list[Any], k: int) -> None:
    """``entries`` (vLLM's prompt_logprobs of ``ids``) against a full forward of ``model``."""
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)
    assert len(entries) == len(ids) and entries[0] is None
    for p in range(1, len(ids)):
        row, entry = logprobs[p - 1], entries[p]
        token = entry[str(ids[p])]
        assert token["logprob"] == pytest.approx(row[ids[p]].item(), abs=1e-4)
        assert token["rank"] == int((row >= row[ids[p]]).sum())
        assert token["decoded_token"] == env.backend.tokenizer.decode([ids[p]], skip_special_tokens=False)
        values, top = row.topk(k)
        assert set(entry) == {str(ids[p])} | {str(t) for t in top.tolist()}
        for rank, (value, t) in enumerate(zip(values.tolist(), top.tolist()), start=1):
            assert entry[str(t)]["logprob"] == pytest.approx(value, abs=1e-4)
            assert t == ids[p] or entry[str(t)]["rank"] == rank


def test_text_completion_choices_carry_the_prompt_logprobs(env: Env, reference: Any) -> None:
    answer = env.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2, n=2, seed=1,
                                             extra_body={"prompt_logprobs": 3})
    ids = env.backend.tokenizer.encode(PROMPT)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    first = answer.choices[0].model_dump()["prompt_logprobs"]
    assert_matches_reference(env, reference, ids, first, 3)
    assert answer.choices[1].model_dump()["prompt_logprobs"] == first  # each choice carries them
    assert answer.choices[0].logprobs is None  # logprobs not asked for
    env.wait_idle()


def test_chat_completion_carries_them_at_the_top_level(env: Env, reference: Any) -> None:
    answer = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                                  extra_body={"prompt_logprobs": 2})
    ids = env.backend.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    assert_matches_reference(env, reference, ids, answer.model_dump()["prompt_logprobs"], 2)
    assert "prompt_logprobs" not in answer.choices[0].model_dump()
    env.wait_idle()


def test_a_cached_prefix_still_gets_every_prompt_logprob(env: Env, reference: Any) -> None:
    client = env.client()
    prompt = "A long shared prefix about railways and their many stations. " * 4
    client.completions.create(model="tiny", prompt=prompt, max_tokens=2)  # warms the prefix cache
    warm = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    assert (warm.usage.prompt_tokens_details.cached_tokens or 0) > 0
    scored = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 1})
    ids = env.backend.tokenizer.encode(prompt)
    assert_matches_reference(env, reference, ids, scored.choices[0].model_dump()["prompt_logprobs"], 1)
    env.wait_idle()


def test_echo_keeps_its_own_count_beside_prompt_logprobs(env: Env) -> None:
    answer = env.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                             extra_body={"prompt_logprobs": 5})
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.top_logprobs is not None
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:] if top is not None)
    entries = choice.model_dump()["prompt_logprobs"]
    assert all(5 <= len(e) <= 6 for e in entries[1:])
    for value, entry, token in zip(choice.logprobs.token_logprobs[1:], entries[1:],  # type: ignore[index]
                                   env.backend.tokenizer.encode(PROMPT)[1:]):
        assert entry[str(token)]["logprob"] == value
    env.wait_idle()


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("k", [0, 2])
def test_streaming_them_is_a_400_naming_the_field(env: Env, chat: bool, k: int) -> None:
    client = env.client()
    with pytest.raises(openai.BadRequestError) as info:
        if chat:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, stream=True,
                                           extra_body={"prompt_logprobs": k})
        else:
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, stream=True,
                                      extra_body={"prompt_logprobs": k})
    assert info.value.param == "prompt_logprobs" and "stream" in info.value.message


@pytest.mark.parametrize("k", [-1, 21])
def test_past_the_cap_is_a_400_naming_the_field(env: Env, k: int) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": k})
    assert info.value.param == "prompt_logprobs"


def test_a_text_completion_takes_vllms_twenty_logprobs_not_openais_five(env: Env) -> None:
    """``logprobs`` on /v1/completions goes to 20 (vLLM's ``max_logprobs``; OpenAI's own cap of 5
    is its upstream's to enforce), whole and streamed; past 20 a 400 names it."""
    client = env.client()
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=20, temperature=0)
    # keyed by the token's text, as OpenAI's: tokens decoding alike (the tiny model's bytes) share a key
    assert [5 < len(top) <= 20 for top in answer.choices[0].logprobs.top_logprobs] == [True, True]
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=20, stream=True,
                                            temperature=0))
    assert [top for c in chunks if c.choices and c.choices[0].logprobs
            for top in c.choices[0].logprobs.top_logprobs] == answer.choices[0].logprobs.top_logprobs
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=21)
    assert info.value.param == "logprobs"
    env.wait_idle()
