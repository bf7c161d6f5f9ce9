"""vLLM's chat ``echo`` on the built-in engine and on the transformers fallback (the same tiny model),
through the gateway with the openai SDK: each choice's content starts with the final message when
that message has the answer's role (the assistant's, or with ``add_generation_prompt: false`` the
final message's own, which the answer then carries), streamed as its own delta after the role; it
carries no logprobs and the usage stays the exact counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.local_gateway import Env, local_gateway

PREFIX = "One, two, three,"
PREFILL = [{"role": "user", "content": "Count to ten."}, {"role": "assistant", "content": PREFIX}]
ASKED = [{"role": "user", "content": "Tell me about trains."}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    fallback = {"name": "tiny-hf", "max_retries": 0,
                "deployments": [{"provider": "transformers", "model": "{folder}", "options": {}}]}
    with local_gateway(tmp_path_factory.mktemp("chat-echo"), extra_models=[fallback]) as served:
        yield served


def _create(env: Env, messages: list[Any], extra: dict[str, Any], model: str = "tiny", **args: Any) -> Any:
    return env.client().chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True, **extra}, **args)


PARTS = [{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "about trains."}]}]


@pytest.mark.parametrize("model", ["tiny", "tiny-hf"])
@pytest.mark.parametrize(("messages", "extra", "echoed", "role"), [
    (PREFILL, CONTINUE, PREFIX, "assistant"),  # the assistant's prefix, then its continuation
    (PREFILL, {}, PREFIX, "assistant"),  # a new assistant turn after an assistant message: the same role
    (ASKED, {"add_generation_prompt": False}, ASKED[0]["content"], "user"),  # the answer goes on with it
    (PARTS, {"add_generation_prompt": False}, "Tell me\nabout trains.", "user"),  # parts: vLLM joins with \n
    (ASKED, {}, "", "assistant"),  # the final message is the user's, the answer the assistant's: nothing echoed
])
def test_each_choice_starts_with_the_echo_and_usage_stays_exact(
        env: Env, model: str, messages: list[Any], extra: dict[str, Any], echoed: str, role: str) -> None:
    plain = _create(env, messages, extra, model, n=2)
    env.usage.records.clear()
    echo = _create(env, messages, {**extra, "echo": True}, model, n=2)
    assert [c.message.content for c in echo.choices] == [echoed + (c.message.content or "") for c in plain.choices]
    assert {c.message.role for c in echo.choices} == {c.message.role for c in plain.choices} == {role}
    assert echo.usage.prompt_tokens == plain.usage.prompt_tokens
    assert echo.usage.completion_tokens == plain.usage.completion_tokens == 12  # generated tokens only
    record = env.usage.wait_for(1)[-1]
    assert record.exact and (record.prompt_tokens, record.completion_tokens) == (plain.usage.prompt_tokens, 12)
    env.wait_idle()


@pytest.mark.parametrize("model", ["tiny", "tiny-hf"])
@pytest.mark.parametrize(("messages", "extra", "echoed", "role"), [
    (PREFILL, CONTINUE, PREFIX, "assistant"), (ASKED, {"add_generation_prompt": False}, ASKED[0]["content"], "user")])
def test_a_stream_sends_the_echo_after_the_role_and_before_the_answer(
        env: Env, model: str, messages: list[Any], extra: dict[str, Any], echoed: str, role: str) -> None:
    whole = _create(env, messages, {**extra, "echo": True}, model, n=2)
    chunks = list(_create(env, messages, {**extra, "echo": True}, model, n=2, stream=True,
                          stream_options={"include_usage": True}))
    for i in range(2):
        deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].index == i]
        assert deltas[0].role == role and not deltas[0].content
        assert deltas[1].content == echoed and deltas[1].role is None
        assert "".join(d.content or "" for d in deltas) == whole.choices[i].message.content
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    env.wait_idle()


def test_the_echo_carries_no_logprobs(env: Env) -> None:
    echo = _create(env, PREFILL, {**CONTINUE, "echo": True}, logprobs=True, top_logprobs=2)
    plain = _create(env, PREFILL, CONTINUE, logprobs=True, top_logprobs=2)
    got, want = echo.choices[0].logprobs.content, plain.choices[0].logprobs.content
    assert len(got) == echo.usage.completion_tokens == 6
    assert [(lp.token, lp.logprob) for lp in got] == [(lp.token, lp.logprob) for lp in want]
    chunks = list(_create(env, PREFILL, {**CONTINUE, "echo": True}, logprobs=True, stream=True))
    echoed = [c.choices[0] for c in chunks if c.choices and c.choices[0].delta.content == PREFIX]
    assert len(echoed) == 1 and echoed[0].logprobs is None
    streamed = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert [lp.token for lp in streamed] == [lp.token for lp in want]
    env.wait_idle()


@pytest.mark.parametrize("model", ["tiny", "tiny-hf"])
def test_echo_must_be_a_boolean(env: Env, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _create(env, PREFILL, {"echo": "yes"}, model)
    assert err.value.body["param"] == "echo"  # type: ignore[index]
    assert _create(env, PREFILL, {"echo": None}, model).choices[0].message.content == _create(
        env, PREFILL, {}, model).choices[0].message.content
