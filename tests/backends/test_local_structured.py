"""Structured output through the gateway with the openai SDK: every answer, streamed and not,
parses and validates; vLLM's spellings; logit_bias; bad input is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.engine.test_structured_output import SCHEMAS
from tests.support.local_gateway import Env, local_gateway

MESSAGES: list[Any] = [{"role": "user", "content": "Give me data"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("structured")) as s:
        yield s


def _fmt(schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_answers_validate(env: Env, schema: dict[str, Any]) -> None:
    client = env.client()
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=_fmt(schema), n=2,
                                       temperature=1.0, seed=4, max_tokens=300)
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content or ""), schema)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=_fmt(schema),
                                            temperature=1.0, seed=5, max_tokens=300, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(text), schema)


def test_json_object(env: Env) -> None:
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=300, seed=1,
                                             response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


def test_sdk_parse_with_a_pydantic_model(env: Env) -> None:
    r = env.client().chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Person, max_tokens=300)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Person) and 0 <= parsed.age <= 120


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"choice": ["alpha", "beta"]}},
    {"guided_choice": ["alpha", "beta"]},
    # options that change nothing here: the engine's JSON has no free whitespace, and it has one backend
    {"structured_outputs": {"choice": ["alpha", "beta"], "disable_any_whitespace": True, "disable_fallback": True,
                            "whitespace_pattern": None, "disable_additional_properties": False}},
])
def test_vllm_choice(env: Env, extra: dict[str, Any]) -> None:
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, extra_body=extra)
    assert r.choices[0].message.content in ("alpha", "beta")


def test_vllm_regex_json_and_completions(env: Env) -> None:
    client = env.client()
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20,
                                       extra_body={"guided_regex": "[a-c]{4}"})
    assert len(r.choices[0].message.content or "") == 4
    c = client.completions.create(model="tiny", prompt="Hello", max_tokens=300,
                                  extra_body={"structured_outputs": {"json": SCHEMAS[0]}})
    jsonschema.validate(json.loads(c.choices[0].text), SCHEMAS[0])


def test_logit_bias_bans_and_forces(env: Env) -> None:
    client = env.client()
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, logit_bias={"77": 100},
                                  extra_body={"ignore_eos": True})
    ids = env.backend.tokenize_text(r.choices[0].text, add_special_tokens=False)
    assert ids == [77] * 4 or r.choices[0].text == env.backend.detokenize([77] * 4)


# Properties in an order that is not alphabetical (as "reasoning before answer" schemas have them).
ORDERED = {"type": "object", "properties": {"zeta": {"type": "string", "maxLength": 4},
                                            "alpha": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["zeta", "alpha"], "additionalProperties": False}


@pytest.mark.parametrize("extra", [
    {"response_format": _fmt(ORDERED)},
    {"extra_body": {"guided_json": ORDERED}},
    {"extra_body": {"structured_outputs": {"json": ORDERED}}},
])
def test_json_answers_keep_the_schemas_property_order(env: Env, extra: dict[str, Any]) -> None:
    """As OpenAI documents it (and vLLM's grammar does): the answer's keys come in the schema's order."""
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60, temperature=0, **extra)
    assert list(json.loads(r.choices[0].message.content or "")) == ["zeta", "alpha"]


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"response_format": _fmt({"type": "string", "pattern": "(?<=a)b"})}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"extra_body": {"guided_json": "{nope"}}, "guided_json"),
    ({"extra_body": {"structured_outputs": {"regex": "("}}}, "structured_outputs.regex"),
    ({"extra_body": {"guided_grammar": "root ::= ("}}, "guided_grammar"),  # GBNF the converter rejects
    ({"extra_body": {"guided_grammar": "root ::= item"}}, "guided_grammar"),  # a rule never defined
    ({"extra_body": {"structured_outputs": {"grammar": 'root ::= "a'}}}, "structured_outputs.grammar"),
    # vLLM options the engine does not honour: never silently dropped
    ({"extra_body": {"structured_outputs": {"choice": ["a"], "whitespace_pattern": " "}}},
     "structured_outputs.whitespace_pattern"),
    ({"extra_body": {"structured_outputs": {"json": SCHEMAS[0], "disable_additional_properties": True}}},
     "structured_outputs.disable_additional_properties"),
    ({"extra_body": {"structured_outputs": {"structural_tag": "{}"}}}, "structured_outputs.structural_tag"),
    ({"extra_body": {"guided_regex": "a", "guided_choice": ["b"]}}, "guided_choice"),
    # llguidance's own options in a schema would let the answer stop being JSON ({aaa"k":1})
    ({"response_format": _fmt({"type": "object", "x-guidance": {"whitespace_pattern": "a+"}})},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "x-guidance": {"key_separator": "="}}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters"),
    ({"logit_bias": {"5": 150}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
])
def test_bad_input_is_a_400_naming_the_field(env: Env, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, **kwargs)
    assert info.value.param == param, info.value.body


_LOOP = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
         "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_looping_on_itself_is_a_400_before_any_answer(env: Env, stream: bool) -> None:
    # It used to compile, then fail when generation reached the loop: streamed, after a 200.
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, stream=stream,
                                             response_format=_fmt(_LOOP))
    assert info.value.param == "response_format.json_schema.schema"
    assert "refers to itself" in str(info.value.body)
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": _LOOP}}]
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, stream=stream,
                                             tools=tools, tool_choice="required")
    assert "refers to itself" in str(info.value.body)
