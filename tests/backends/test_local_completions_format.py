"""``response_format`` on ``/v1/completions`` over the built-in engine, as vLLM takes it there and as
chat takes it: every answer, streamed and not, n > 1, parses and validates; what chat refuses (a
conflicting constraint, a schema the grammar cannot enforce, a shape chat's field does not take) is
the same 400 naming the same field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.engine.test_structured_output import SCHEMAS
from tests.support.local_gateway import Env, local_gateway


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("completions-format")) as s:
        yield s


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def _complete(env: Env, fmt: dict[str, Any] | None, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 300)
    extra = kw.pop("extra_body", {})
    body = extra if fmt is None else {**extra, "response_format": fmt}
    return env.client().completions.create(model="tiny", prompt="Give me data", extra_body=body, **kw)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_answers_validate(env: Env, schema: dict[str, Any]) -> None:
    r = _complete(env, _fmt(schema), n=2, temperature=1.0, seed=4)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in _complete(env, _fmt(schema), n=2, temperature=1.0, seed=5, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert sorted(texts) == [0, 1]
    for i, text in texts.items():
        assert finish[i] == "stop"
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_json_object(env: Env, stream: bool) -> None:
    if stream:
        text = "".join(c.choices[0].text for c in _complete(env, {"type": "json_object"}, seed=1, stream=True)
                       if c.choices)
    else:
        r = _complete(env, {"type": "json_object"}, seed=1)
        assert r.choices[0].finish_reason == "stop"
        text = r.choices[0].text
    assert isinstance(json.loads(text), dict)


def test_text_format_constrains_nothing(env: Env) -> None:
    plain = _complete(env, None, max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True})
    text = _complete(env, {"type": "text"}, max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True})
    assert text.choices[0].text == plain.choices[0].text


@pytest.mark.parametrize(("fmt", "extra", "param"), [
    # conflicts with the other spellings, as on chat: the second constraint is named
    ({"type": "json_object"}, {"guided_json": SCHEMAS[0]}, "guided_json"),
    (_fmt(SCHEMAS[0]), {"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ({"type": "json_object"}, {"guided_choice": ["a", "b"]}, "guided_choice"),
    # what the grammar cannot enforce, and shapes chat's response_format does not take
    (_fmt({"type": "string", "pattern": "(?<=a)b"}), {}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, {}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMAS[0]}}, {}, "response_format.json_schema.name"),
    ({"type": "structural_tag", "format": {"type": "triggered_tags"}}, {}, "response_format.type"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_a_400_naming_the_field_as_on_chat(env: Env, fmt: dict[str, Any], extra: dict[str, Any],
                                                       param: str, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _complete(env, fmt, max_tokens=5, stream=stream, extra_body=extra)
    assert info.value.param == param, info.value.body
    with pytest.raises(openai.BadRequestError) as chat:
        env.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                             stream=stream, extra_body={**extra, "response_format": fmt})
    assert chat.value.param == param, chat.value.body
