"""``POST /v1/responses/input_tokens`` on the built-in engine, with the openai SDK: the exact count of
the prompt the engine runs for the same request (its translation to chat, rendered with the chat
template), as ``usage.input_tokens`` of a real ``responses.create`` reports it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.local_gateway import Env, local_gateway

TURNS: Any = [{"role": "user", "content": "Trains run on rails."},
              {"role": "assistant", "content": "They do."},
              {"role": "user", "content": [{"type": "input_text", "text": "And trams?"}]}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("responses_count")) as s:
        yield s


@pytest.mark.parametrize(("given", "instructions"), [("hello there", None), (TURNS, "Be brief.")])
def test_the_count_is_the_prompt_the_engine_runs(env: Env, given: Any, instructions: str | None) -> None:
    client = env.client()
    extra = {"instructions": instructions} if instructions else {}
    counted = client.responses.input_tokens.count(model="tiny", input=given, **extra)
    ran = client.responses.create(model="tiny", input=given, max_output_tokens=2, **extra)
    assert counted.object == "response.input_tokens"
    assert ran.usage is not None and counted.input_tokens == ran.usage.input_tokens > 0
    env.wait_idle()


def test_what_the_engine_cannot_run_is_a_400_naming_it(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        env.client().responses.input_tokens.count(model="tiny", input="x", extra_body={"background": True})
    assert refused.value.body["param"] == "background"  # type: ignore[index]
