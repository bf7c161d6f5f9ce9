"""Bad input to the built-in engine, through the gateway with the official SDK: what a chat template
cannot take from ``chat_template_kwargs`` (a renderer's own argument, a variable of the wrong type)
and ``logit_bias`` keys that are not plain token ids are each a 400 naming the field, never a 500
and never silently read as something else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.tiny_model import CHAT_TEMPLATE, build_tiny_model
from tests.support.local_gateway import KEY, Env, local_gateway

MESSAGES: Any = [{"role": "user", "content": "Tell me about trains."}]
# As real templates (Qwen's, SmolLM2's) do: the tools are listed before the conversation.
TOOLS_TEMPLATE = "{%- if tools %}{%- for tool in tools %}{{- tool['function']['name'] }}{%- endfor %}{%- endif %}"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("bad_input")
    folder = build_tiny_model(work / "tiny", seed=5, max_position_embeddings=2048)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOOLS_TEMPLATE + CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    with local_gateway(work, model=str(folder)) as served:
        yield served


def _refused(env: Env, param: str, **extra: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, extra_body=extra)
    error: Any = caught.value.body
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error", error
    return caught.value


@pytest.mark.parametrize("name", ["continue_final_message", "add_special_tokens", "add_generation_prompt",
                                  "messages"])
def test_a_renderers_own_argument_in_chat_template_kwargs_is_a_400(env: Env, name: str) -> None:
    """These are the request's own fields (or the conversation), not template variables: naming one
    in chat_template_kwargs was a 500 (two values for one argument) or silently dropped."""
    refused = _refused(env, f"chat_template_kwargs.{name}", chat_template_kwargs={name: True})
    assert name in refused.message
    tokenized = httpx.post(env.server.url + "/tokenize", headers={"authorization": f"Bearer {KEY}"}, timeout=30,
                           json={"model": "tiny", "messages": MESSAGES, "chat_template_kwargs": {name: True}})
    assert tokenized.status_code == 400, tokenized.text
    assert tokenized.json()["error"]["param"] == f"chat_template_kwargs.{name}"
    env.wait_idle()


@pytest.mark.parametrize("tools", [5, 1.5, True])
def test_a_template_variable_the_template_cannot_use_is_a_400(env: Env, tools: Any) -> None:
    """A variable of a type the template cannot work with (a number where it iterates) was a
    TypeError out of the template: a 500."""
    refused = _refused(env, "chat_template_kwargs", chat_template_kwargs={"tools": tools})
    assert "chat template" in refused.message
    env.wait_idle()


def test_the_tools_template_still_renders_tools(env: Env) -> None:
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    answer = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, tools=tools)
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    env.wait_idle()


@pytest.mark.parametrize("key", ["1_0", " 1", "1 ", "+1", "\uff11", "01_0"])
def test_logit_bias_keys_must_be_plain_token_ids(env: Env, key: str) -> None:
    """Python's int() reads "1_0" as 10 and a full-width digit as a digit: those keys were taken as
    other tokens than the client wrote, silently."""
    refused = _refused(env, "logit_bias", logit_bias={key: 5})
    assert repr(key) in refused.message


def test_a_plain_token_id_key_is_taken(env: Env) -> None:
    answer = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                                  logit_bias={"10": 100, "007": -100})
    assert answer.choices[0].finish_reason in ("stop", "length")
    env.wait_idle()
