"""Structured output and tool calls on the plain transformers path (a LogitsProcessor driven by the
engine's llguidance grammars): every answer, streamed and not, validates; vLLM's spellings; a named
or required tool_choice returns calls whose arguments validate; a finished grammar ends its row even
while EOS is banned; bad input is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from backends.base import BadRequest
from backends.factory import build_backend
from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from backends.transformers_generate import HFGenerateBackend
from gateway.body import decode_body
from gateway.settings import DeploymentConfig
from tests.backends.test_local_tools import NAMED, TOOLS, WEATHER
from tests.backends.test_local_tools import SCHEMAS as TOOL_SCHEMAS
from tests.engine.test_structured_output import SCHEMAS
from tests.support.fallback_models import build_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT-NeoX whose chat template also names the tools (the context is 256 tokens)."""
    path = build_model("gpt_neox", tmp_path_factory.mktemp("hf-structured"))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    names = "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>{%- endif %}"
    config["chat_template"] = names + config["chat_template"]
    config_file.write_text(json.dumps(config))
    return path


@pytest.fixture
async def backend(folder: Path) -> AsyncIterator[HFGenerateBackend]:
    made = build_backend(DeploymentConfig(provider="transformers", model=str(folder), options={}))
    assert isinstance(made, HFGenerateBackend)
    yield made
    await made.aclose()


def chat(**kw: Any) -> ChatCompletionRequest:
    kw.setdefault("max_tokens", 200)
    kw.setdefault("temperature", 1.0)
    return wire({"model": "m", "messages": [{"role": "user", "content": "Give me data"}], **kw})


def wire(body: dict[str, Any]) -> ChatCompletionRequest:
    """The request as the gateway decodes it from the wire."""
    return msgspec.json.decode(json.dumps(body), type=ChatCompletionRequest)


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


async def _streamed(backend: HFGenerateBackend, request: ChatCompletionRequest) -> tuple[str, list[Any], Any]:
    """The streamed content, tool-call deltas and finish reason of choice 0."""
    stream = await backend.chat_stream(request)
    text, calls, finish = "", [], None
    async for ch in stream:
        for c in ch.choices:
            text += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    return text, calls, finish


@pytest.mark.parametrize("schema", SCHEMAS)
async def test_json_schema_answers_validate_streamed_and_not(backend: HFGenerateBackend,
                                                             schema: dict[str, Any]) -> None:
    whole = await backend.chat(chat(response_format=_fmt(schema), n=2, seed=4))
    for c in whole.response.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content or ""), schema)
    text, _, finish = await _streamed(backend, chat(response_format=_fmt(schema), stream=True, seed=5))
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


async def test_json_object(backend: HFGenerateBackend) -> None:
    """Any JSON object; the random model would ramble in its keys, so a bias on ``}`` (applied
    before the grammar's mask) closes it early."""
    close = backend.tokenizer.convert_tokens_to_ids("}")
    r = await backend.chat(chat(response_format={"type": "json_object"}, seed=2, n=4, logit_bias={str(close): 8}))
    for c in r.response.choices:
        assert c.finish_reason == "stop"
        assert isinstance(json.loads(c.message.content or ""), dict)


async def test_constrained_and_free_requests_share_a_batch(backend: HFGenerateBackend) -> None:
    free = chat(max_tokens=8, ignore_eos=True)
    constrained, plain = await asyncio.gather(backend.chat(chat(response_format=_fmt(SCHEMAS[0]))),
                                              backend.chat(free))
    jsonschema.validate(json.loads(constrained.response.choices[0].message.content or ""), SCHEMAS[0])
    assert plain.meter.completion_tokens == 8


async def test_vllm_spellings(backend: HFGenerateBackend) -> None:
    r = await backend.chat(chat(guided_choice=["yes", "no"]))
    assert r.response.choices[0].message.content in ("yes", "no")
    r = await backend.chat(chat(structured_outputs={"regex": r"[0-9]{3}-x"}))
    text = r.response.choices[0].message.content or ""
    assert len(text) == 5 and text[:3].isdigit() and text.endswith("-x")
    done = await backend.complete(CompletionRequest(model="m", prompt="Hi", max_tokens=200, temperature=1.0,
                                                    guided_json=SCHEMAS[1], n=2))
    for c in done.response.choices:
        jsonschema.validate(json.loads(c.text), SCHEMAS[1])
    lark = await backend.complete(CompletionRequest(model="m", prompt="Hi", max_tokens=20,
                                                    guided_grammar='start: "a" ("b" | "c")'))
    assert lark.response.choices[0].text in ("ab", "ac")


def completion(**kw: Any) -> CompletionRequest:
    """A text completion as the gateway decodes it, its unmodelled fields (``response_format``) kept."""
    body = {"model": "m", "prompt": "Hi", "max_tokens": 200, "temperature": 1.0, **kw}
    return decode_body(json.dumps(body).encode(), CompletionRequest)


async def test_completions_response_format(backend: HFGenerateBackend) -> None:
    done = await backend.complete(completion(response_format=_fmt(SCHEMAS[1]), n=2, seed=2))
    for c in done.response.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), SCHEMAS[1])
    stream = await backend.complete_stream(completion(response_format=_fmt(SCHEMAS[0]), stream=True, seed=3))
    chunks = [c async for ch in stream for c in ch.choices]
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["stop"]
    jsonschema.validate(json.loads("".join(c.text for c in chunks)), SCHEMAS[0])
    free = await backend.complete(completion(response_format={"type": "json_object"}, seed=3))
    if free.response.choices[0].finish_reason == "stop":  # else cut off by max_tokens inside a string
        assert isinstance(json.loads(free.response.choices[0].text), dict)
    for kw, param in [({"response_format": {"type": "json_object"}, "guided_json": SCHEMAS[0]}, "guided_json"),
                      ({"response_format": {"type": "structural_tag"}}, "response_format.type")]:
        with pytest.raises(BadRequest) as info:
            await backend.complete(completion(**kw))
        assert info.value.param == param, info.value


@pytest.mark.parametrize("ban", ["min_tokens", "logit_bias"])
async def test_a_finished_grammar_stops_even_when_eos_is_banned(backend: HFGenerateBackend, ban: str) -> None:
    eos = backend.worker.eos_ids
    extra: dict[str, Any] = {"min_tokens": 12} if ban == "min_tokens" else {"logit_bias": {str(t): -100 for t in eos}}
    r = await backend.chat(chat(structured_outputs={"regex": r"[0-9]{3}-x"}, max_tokens=40, **extra))
    c = r.response.choices[0]
    assert c.finish_reason == "stop" and len(c.message.content or "") == 5
    assert r.meter.completion_tokens <= 5  # never a token past the grammar
    text, _, finish = await _streamed(backend, chat(response_format=_fmt(SCHEMAS[0]), stream=True, **extra))
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS[0])


async def test_named_tool_choice_returns_a_valid_call(backend: HFGenerateBackend) -> None:
    r = await backend.chat(chat(tools=TOOLS, tool_choice=NAMED, n=2, seed=2))
    for c in r.response.choices:
        assert c.finish_reason == "stop"  # a named call ends so, as OpenAI's and vLLM's
        calls = c.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    _, deltas, finish = await _streamed(backend, chat(tools=TOOLS, tool_choice=NAMED, stream=True))
    assert finish == "stop" and deltas[0].function["name"] == "get_weather"
    jsonschema.validate(json.loads("".join(d.function["arguments"] for d in deltas)), WEATHER)


async def test_required_tool_choice_returns_valid_calls(backend: HFGenerateBackend) -> None:
    r = await backend.chat(chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=3,
                                max_tokens=200))
    c = r.response.choices[0]
    assert c.finish_reason == "tool_calls"
    calls = c.message.tool_calls or []
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0].function.arguments), TOOL_SCHEMAS[calls[0].function.name])


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
async def test_streamed_tool_calls_carry_the_logprobs_asked_for(backend: HFGenerateBackend, tool_choice: Any) -> None:
    body = dict(tools=TOOLS, tool_choice=tool_choice, seed=4, max_tokens=12, logprobs=True, top_logprobs=2)
    whole = (await backend.chat(chat(**body))).response.choices[0].logprobs
    assert whole is not None and whole.content
    stream = await backend.chat_stream(chat(**body, stream=True))
    streamed = [t for c in [c async for c in stream.chunks] for ch in c.choices if ch.logprobs
                for t in ch.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.content]


async def test_auto_streams_the_content_as_it_is_generated(backend: HFGenerateBackend) -> None:
    """With tools and ``auto`` the content streams as it comes (held only from where a call may
    start), and is the whole answer's content, its logprobs with it."""
    body = dict(tools=TOOLS, seed=3, max_tokens=12, logprobs=True)
    whole = (await backend.chat(chat(**body))).response.choices[0]
    assert whole.message.content and not whole.message.tool_calls
    stream = await backend.chat_stream(chat(**body, stream=True))
    choices = [c for ch in [ch async for ch in stream.chunks] for c in ch.choices]
    deltas = [c.delta.content for c in choices if c.delta.content]
    assert len(deltas) > 1 and "".join(deltas) == whole.message.content
    assert whole.logprobs is not None
    streamed = [(t.token, t.logprob) for c in choices if c.logprobs for t in c.logprobs.content]
    assert streamed == [(t.token, t.logprob) for t in whole.logprobs.content]
    assert [c.finish_reason for c in choices if c.finish_reason] == [whole.finish_reason]


async def test_tool_role_messages_and_tool_choice_none(backend: HFGenerateBackend) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    request = wire({"model": "m", "messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 5})
    r = await backend.chat(request)
    assert not r.response.choices[0].message.tool_calls
    auto = await backend.chat(wire({"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 5}))
    assert auto.meter.prompt_tokens > r.meter.prompt_tokens  # the tools are rendered by the chat template


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"response_format": _fmt({"type": "objekt"})}, "response_format.json_schema.schema"),
    ({"response_format": _fmt({"type": "string", "pattern": "(?<=a)b"})}, "response_format.json_schema.schema"),
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?<=x)y"}}}}}], "tool_choice": "required"}, "tool_choice"),
    # a forced call's grammar shapes the output: the request's own constraint could not hold as well
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a+"}, "guided_regex"),
])
async def test_bad_input_is_a_400_naming_the_field(backend: HFGenerateBackend, kwargs: dict[str, Any],
                                                   param: str) -> None:
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat(**kwargs))
    assert info.value.param == param, info.value
    assert backend.stats().in_flight == 0
