"""A client gone before it read everything is charged every token the engine generated for it,
exactly: also those of a later prompt of a text completion (read only after the first prompt's),
and those of the step that was running when it left. Through the gateway with the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.local_gateway import Env, local_gateway


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("unread")) as served:
        yield served


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_generated_for_a_client_gone_are_all_charged(env: Env, stream: bool) -> None:
    env.wait_idle()
    env.usage.records.clear()
    before = env.backend.engine_metrics().generation_tokens
    kw: dict[str, Any] = {"model": "tiny", "prompt": ["Tell me about trains.", "And about boats."], "max_tokens": 1900,
          "temperature": 0, "extra_body": {"ignore_eos": True}}
    if stream:
        answer = env.client().completions.create(stream=True, **kw)
        for chunk in answer:  # the first prompt's tokens only: the second one's wait, unread
            if chunk.choices and chunk.choices[0].index == 0 and len(chunk.choices[0].text) > 20:
                break
        answer.close()
    else:
        with pytest.raises(openai.APITimeoutError):
            env.client().with_options(timeout=1.0).completions.create(**kw)
    record = env.usage.wait_for(1)[-1]
    env.wait_idle()
    generated = env.backend.engine_metrics().generation_tokens - before
    assert record.extra.get("outcome") == "client_disconnected"
    assert record.exact and 0 < generated < 2 * 1900
    assert record.completion_tokens == generated
