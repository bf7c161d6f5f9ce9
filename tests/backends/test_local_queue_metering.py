"""A client gone while its request still waits in the engine's queue (one sequence at a time here,
and another one running) is charged no prompt tokens, exactly: the engine never started on it. One
gone after the engine started keeps the exact prompt and what was generated. Unary and streamed,
through the gateway with the openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from backends.openai_wire import ChatCompletionRequest, ChatMessage
from tests.support.local_gateway import Env, local_gateway

MESSAGES: Any = [{"role": "user", "content": "Tell me about trains."}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("queued"), max_num_seqs=1) as served:
        yield served


def _wait_for(env: Env, running: int, waiting: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = env.backend.engine_metrics()
        if (m.num_running, m.num_waiting) == (running, waiting):
            return
        time.sleep(0.01)
    raise AssertionError(f"engine not at {running} running, {waiting} waiting: {env.backend.engine_metrics()}")


def _occupy(env: Env) -> Any:
    """A long stream holding the engine's one sequence slot (started: its first token came)."""
    stream = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1900,
                                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    return stream


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_gone_while_queued_is_charged_no_prompt(env: Env, stream: bool) -> None:
    busy = _occupy(env)
    env.usage.records.clear()
    if stream:
        queued: Any = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, stream=True)
        assert next(iter(queued)).choices[0].delta.role == "assistant"  # the role chunk comes at once
        _wait_for(env, running=1, waiting=1)
        queued.close()
    else:
        with pytest.raises(openai.APITimeoutError):
            env.client().with_options(timeout=0.5).chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=8)
    record = env.usage.wait_for(1)[-1]
    assert record.extra.get("outcome") == "client_disconnected"
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (0, 0, True)
    _wait_for(env, running=1, waiting=0)  # the queued request is gone, the busy one runs on
    busy.close()
    env.wait_idle()


def test_a_unary_request_gone_after_it_started_keeps_the_exact_prompt(env: Env) -> None:
    env.usage.records.clear()
    request = ChatCompletionRequest(model="tiny", messages=[ChatMessage(role="user", content=MESSAGES[0]["content"])])
    prompt = len(env.backend.tokenize_chat(request))
    with pytest.raises(openai.APITimeoutError):
        env.client().with_options(timeout=0.5).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=1900, temperature=0,
            extra_body={"ignore_eos": True})
    record = env.usage.wait_for(1)[-1]
    assert record.extra.get("outcome") == "client_disconnected"
    assert record.exact and record.prompt_tokens == prompt and 0 < record.completion_tokens < 1900
    env.wait_idle()

