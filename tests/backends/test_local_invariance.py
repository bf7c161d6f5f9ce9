"""Properties of the built-in engine's answers through the gateway, with the openai SDK: a request
answers the same alone and among concurrent batch mates (prefix caching on, a KV cache so small
that the batch is preempted), and streamed as whole (text, finish reason, usage, logprobs)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.local_gateway import Env, local_gateway

SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 8}  # a prefix shared by all
VARIANTS: list[dict[str, Any]] = [
    {"temperature": 0, "logprobs": True, "top_logprobs": 2},
    {"temperature": 0, "extra_body": {"repetition_penalty": 1.3}},
    {"temperature": 0, "frequency_penalty": 1.5, "presence_penalty": 0.5},
    {"temperature": 0.9, "seed": 4, "extra_body": {"top_k": 5}},
    {"temperature": 0.9, "seed": 4, "top_p": 0.5},
    {"temperature": 1.2, "seed": 9, "extra_body": {"min_p": 0.2}},
    {"temperature": 0, "logit_bias": {"60": 5, "61": -100}, "extra_body": {"min_tokens": 20}},
    {"temperature": 0.8, "seed": 2, "n": 3, "frequency_penalty": 0.7, "extra_body": {"repetition_penalty": 1.1}},
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    # 22 blocks of 16 hold one long sequence, not eight: the concurrent batch is preempted.
    with local_gateway(tmp_path_factory.mktemp("invariance"), max_model_len=352, num_kv_blocks=22,
                       enable_prefix_caching=True, max_num_batched_tokens=48) as s:
        yield s


def _chat(env: Env, i: int) -> Any:
    messages: list[Any] = [SYSTEM, {"role": "user", "content": f"question {i} " + "word " * (7 * i)}]
    return env.client().chat.completions.create(model="tiny", messages=messages, max_tokens=30 + 5 * i,
                                                **VARIANTS[i])


def _answer(a: Any) -> list[tuple[str | None, str | None, list[str]]]:
    return [(c.message.content, c.finish_reason, [t.token for t in c.logprobs.content] if c.logprobs else [])
            for c in a.choices]


def test_a_request_answers_the_same_alone_and_among_preempted_batch_mates(env: Env) -> None:
    alone = [_chat(env, i) for i in range(len(VARIANTS))]
    before = env.backend.engine_metrics().num_preemptions
    with concurrent.futures.ThreadPoolExecutor(len(VARIANTS)) as pool:
        together = list(pool.map(lambda i: _chat(env, i), range(len(VARIANTS))))
    assert env.backend.engine_metrics().num_preemptions > before
    assert len({c.message.content for c in alone[-1].choices}) == 3  # n=3 sampled: the choices differ
    for a, b in zip(alone, together, strict=True):
        assert _answer(a) == _answer(b)
        assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (b.usage.prompt_tokens, b.usage.completion_tokens)
        if a.choices[0].logprobs:
            assert len(a.choices[0].logprobs.content) == a.usage.completion_tokens
            pairs = zip(a.choices[0].logprobs.content, b.choices[0].logprobs.content, strict=True)
            assert all(abs(x.logprob - y.logprob) < 1e-4 for x, y in pairs)
    env.wait_idle()


@pytest.mark.parametrize("extra", [{}, {"include_stop_str_in_output": True}])
def test_streamed_chat_and_completions_equal_the_whole_answer(env: Env, extra: dict[str, Any]) -> None:
    client = env.client()
    greedy = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=16, temperature=0)
    stop = greedy.choices[0].text[5:8]  # spans tokens: cut in the stream where one chunk ends
    kw: dict[str, Any] = {"max_tokens": 16, "temperature": 0.7, "seed": 3, "n": 2, "logprobs": 2,
                          "stop": [stop], "echo": True, "extra_body": extra}
    whole = client.completions.create(model="tiny", prompt=["The quick brown fox", "abc"], **kw)
    chunks = list(client.completions.create(model="tiny", prompt=["The quick brown fox", "abc"], stream=True,
                                            stream_options={"include_usage": True}, **kw))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    for c in whole.choices:
        parts = [p for k in chunks[:-1] for p in k.choices if p.index == c.index]
        assert "".join(p.text for p in parts) == c.text
        assert [p.finish_reason for p in parts if p.finish_reason] == [c.finish_reason]
        streamed = [t for p in parts if p.logprobs for t in p.logprobs.tokens]
        assert streamed == c.logprobs.tokens
        assert [o for p in parts if p.logprobs for o in p.logprobs.text_offset] == c.logprobs.text_offset
    assert any(c.finish_reason == "stop" for c in whole.choices) or stop not in greedy.choices[0].text
