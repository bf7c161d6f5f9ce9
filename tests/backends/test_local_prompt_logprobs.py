"""vLLM's ``prompt_logprobs`` on the built-in engine, through the gateway with the openai SDK: one
entry per prompt token (the first null), each the prompt token with its rank and the ``k`` most
likely tokens, equal to a full forward of the same weights in transformers, on text and chat
completions, also for a prompt whose prefix the cache holds; refused with ``stream`` (as vLLM) and
past the cap of 20 (vLLM's -1, the whole vocabulary, too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.local_gateway import Env, local_gateway

PROMPT = "Trains run on rails between the stations of the old city"
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about trains."}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("prompt_lp"), enable_prefix_caching=True) as served:
        yield served


@pytest.fixture(scope="module")
def reference(env: Env) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(env.folder), dtype=torch.float32).eval()


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
