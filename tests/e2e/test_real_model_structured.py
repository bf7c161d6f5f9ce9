"""Structured output on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) through the
gateway with the openai SDK: for a set of schemas (nested objects, arrays, enums, required fields,
numbers with bounds) every answer, streamed and not, greedy and sampled, parses and validates with
jsonschema; ``client.chat.completions.parse`` with a pydantic model gives the parsed object.

Strings and arrays are bounded so every answer fits its max_tokens. Where the model file cannot be
had these tests fail saying so (as tests/e2e/test_real_model.py), they never pass without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.test_real_model import _model_file
from tests.support.local_gateway import Env, local_gateway

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "array": {"type": "object", "properties": {
        "fruits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4}},
        "required": ["fruits"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "language": {"type": "string", "enum": ["en", "fr", "de"]}},
        "required": ["sentiment", "language"], "additionalProperties": False},
    "required": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 24}, "done": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 12}},
        "required": ["title", "done"], "additionalProperties": False},
    "bounds": {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -40, "maximum": 50},
        "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "maxItems": 3}},
        "required": ["temperature", "humidity", "scores"], "additionalProperties": False},
}
PROMPTS = {
    "nested": "Invent a user with a name and an address. Answer in JSON.",
    "array": "List a few fruits. Answer in JSON.",
    "enum": "Classify: 'I love this phone!' Give its sentiment and language in JSON.",
    "required": "Write a todo item in JSON.",
    "bounds": "Give today's weather in Oslo and three ratings as JSON.",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("real-structured"), model=str(_model_file()), dtype="float32",
                       max_model_len=1024, num_kv_blocks=256) as served:
        yield served


def _fmt(name: str) -> Any:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_answer_validates_streamed_and_not(env: Env, name: str) -> None:
    client = env.client()
    messages: Any = [{"role": "user", "content": PROMPTS[name]}]
    whole = client.chat.completions.create(model="tiny", messages=messages, response_format=_fmt(name),
                                           max_tokens=160, temperature=0.8, seed=7)
    for choice in whole.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMAS[name])
    stream = client.chat.completions.create(model="tiny", messages=messages, response_format=_fmt(name),
                                            max_tokens=160, temperature=0, stream=True)
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), SCHEMAS[name])


class Address(BaseModel):
    city: str = Field(max_length=16)
    country: Literal["France", "Italy", "Norway"]


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    address: Address
    hobbies: list[str] = Field(max_length=3)


def test_sdk_parse_with_a_pydantic_model(env: Env) -> None:
    answer = env.client().chat.completions.parse(
        model="tiny", response_format=Person, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Invent a person living in Rome, with hobbies. Answer in JSON."}])
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and len(person.hobbies) <= 3
    env.wait_idle()


def test_sdk_parse_of_a_required_pydantic_tool(env: Env) -> None:
    """``openai.pydantic_function_tool`` writes the nested model under ``$defs``: with ``required``
    (one grammar for all the tools) the call still parses into the model."""
    answer = env.client().chat.completions.parse(
        model="tiny", tools=[openai.pydantic_function_tool(Person)], tool_choice="required", max_tokens=200,
        temperature=0, messages=[{"role": "user", "content": "Record a person living in Rome, with hobbies."}])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    person = choice.message.tool_calls[0].function.parsed_arguments
    assert isinstance(person, Person) and 0 <= person.age <= 120 and len(person.hobbies) <= 3
    env.wait_idle()
