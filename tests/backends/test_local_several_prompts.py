"""A text completion of several prompts on the built-in engine: their outputs are read as the
engine makes them (interleaved in a stream, as vLLM streams them, not one prompt after another
while the others' outputs pile up unread), and a call cancelled part way is charged every token the
engine generated for it, read or not. Through the gateway with the openai SDK, against the engine's
own count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.local_gateway import Env, local_gateway

PROMPTS = ["Trains", "Boats"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("several")) as served:
        yield served


def test_a_stream_of_several_prompts_interleaves_their_choices(env: Env) -> None:
    chunks = env.client().completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=200, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    order: list[int] = []  # the choice of each chunk, in the order they came
    finished: dict[int, int] = {}  # choice -> the position of its finish chunk
    for chunk in chunks:
        for choice in chunk.choices:
            order.append(choice.index)
            if choice.finish_reason is not None:
                finished[choice.index] = len(order) - 1
    assert sorted(finished) == [0, 1, 2, 3]  # prompt p's i-th choice is p * n + i
    assert min(order.index(2), order.index(3)) < min(finished.values()), "the second prompt waited for the first"
    env.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_a_cancelled_multi_prompt_completion_is_charged_every_generated_token(env: Env, stream: bool) -> None:
    env.wait_idle()
    before = env.backend.engine_metrics().generation_tokens
    env.usage.records.clear()
    asked: dict[str, Any] = {"model": "tiny", "prompt": PROMPTS, "max_tokens": 1500, "temperature": 0,
                             "extra_body": {"ignore_eos": True}}
    if stream:
        chunks = env.client().completions.create(stream=True, **asked)
        for i, _ in enumerate(chunks):
            if i == 20:
                break
        chunks.close()
    else:
        with pytest.raises(openai.APITimeoutError):
            env.client().with_options(timeout=1.0).completions.create(**asked)
    record = env.usage.wait_for(1)[-1]
    env.wait_idle()
    generated = env.backend.engine_metrics().generation_tokens - before
    assert record.extra.get("outcome") == "client_disconnected"
    assert record.exact and record.prompt_tokens == sum(len(env.backend.tokenize_text(p)) for p in PROMPTS)
    assert 0 < record.completion_tokens == generated < 3000
