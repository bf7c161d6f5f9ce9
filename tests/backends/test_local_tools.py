"""Tool calling through the gateway (openai SDK): a named tool_choice and ``required`` are enforced
by the grammar, so the tiny random model returns calls whose arguments validate; streamed as
tool-call deltas; bad tool_choice is a 400 naming the field; the parsers read each format."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from backends.local import tools
from backends.local.tool_parsers import choose_parser, parse_hermes, parse_llama3, parse_mistral
from backends.local.tools import ToolPlan
from engine.tiny_model import build_tiny_model
from tests.support.local_gateway import Env, local_gateway

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["c", "f"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("tools")) as s:
        yield s


def test_named_tool_choice_returns_a_valid_call(env: Env) -> None:
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
                                             max_tokens=200, n=2, temperature=1.0, seed=2)
    for c in r.choices:
        assert c.finish_reason == "stop"  # as OpenAI and vLLM end a call the request named
        calls = c.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]


def test_required_returns_valid_calls(env: Env) -> None:
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                             parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=3)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    calls = c.message.tool_calls or []
    assert len(calls) == 1
    fn = calls[0].function  # type: ignore[union-attr]
    jsonschema.validate(json.loads(fn.arguments), SCHEMAS[fn.name])


# Tool schemas with their own $defs (as openai.pydantic_function_tool writes nested models), one
# name in both meaning different things, and a reference to the schema's root.
SHIP = {"$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                           "required": ["city"], "additionalProperties": False}},
        "type": "object", "properties": {"to": {"$ref": "#/$defs/Addr"}, "kg": {"type": "integer", "maximum": 9}},
        "required": ["to", "kg"], "additionalProperties": False}
TAG = {"$defs": {"Addr": {"type": "string", "maxLength": 6}}, "type": "object",
       "properties": {"label": {"$ref": "#/$defs/Addr"}, "same": {"$ref": "#/properties/label"}},
       "required": ["label", "same"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_tools_whose_schemas_have_defs(env: Env, stream: bool) -> None:
    """``required`` builds one grammar from all the tools: each tool's references still point into
    its own schema (vLLM's grammar hoists the $defs), so every call validates against its tool's."""
    ref_tools: Any = [{"type": "function", "function": {"name": "ship", "parameters": SHIP}},
                      {"type": "function", "function": {"name": "tag", "parameters": TAG}}]
    body: Any = dict(model="tiny", messages=MESSAGES, tools=ref_tools, tool_choice="required", max_tokens=200,
                     n=3, temperature=1.0, seed=6)
    calls: dict[tuple[int, int], list[str]] = {}
    finishes: list[str] = []
    if stream:
        for chunk in env.client().chat.completions.create(**body, stream=True):
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    got = calls.setdefault((c.index, d.index), ["", ""])
                    got[0] += d.function.name or "" if d.function else ""
                    got[1] += d.function.arguments or "" if d.function else ""
                finishes += [c.finish_reason] if c.finish_reason else []
    else:
        for c in env.client().chat.completions.create(**body).choices:
            for i, t in enumerate(c.message.tool_calls or []):
                calls[(c.index, i)] = [t.function.name, t.function.arguments]  # type: ignore[union-attr]
            finishes.append(c.finish_reason)
    assert finishes == ["tool_calls"] * 3 and calls
    for name, args in calls.values():
        jsonschema.validate(json.loads(args), {"ship": SHIP, "tag": TAG}[name])


def test_required_grammar_rebases_each_tools_references() -> None:
    """A reference to a tool schema's root moves with it; a property named like a keyword is a
    schema, a const holding "$ref" is a value."""
    schema = {"type": "object", "properties": {"enum": {"$ref": "#"}, "c": {"const": {"$ref": "#"}}}}
    plan = ToolPlan([{"type": "function", "function": {"name": "t", "parameters": schema}}], "required", None,
                    parallel=True, parser="hermes")
    grammar = plan.grammar()
    assert grammar is not None
    props = json.loads(grammar.spec)["$defs"]["tool0"]["properties"]
    assert props == {"enum": {"$ref": "#/$defs/tool0"}, "c": {"const": {"$ref": "#"}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_forced_call_arguments_keep_the_schemas_property_order(env: Env, stream: bool, tool_choice: Any) -> None:
    """A forced call's arguments have their keys in the order the tool's schema declares them."""
    body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS[:1], tool_choice=tool_choice, max_tokens=300,
                     temperature=1.0, seed=3, parallel_tool_calls=False)
    _, finish, got = _first_choice(env.client(), body, stream)
    assert finish == ("stop" if tool_choice is NAMED else "tool_calls") and len(got) == 1
    assert list(json.loads(got[0][1])) == ["city", "unit", "days"]  # not sorted


def test_streamed_tool_call_deltas(env: Env) -> None:
    stream = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
                                                  max_tokens=200, stream=True)
    name, args, finish = "", "", None
    for ch in stream:
        for choice in ch.choices:
            for d in choice.delta.tool_calls or []:
                name += (d.function.name or "") if d.function else ""
                args += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    assert name == "get_weather" and finish == "stop"  # a named call ends so
    jsonschema.validate(json.loads(args), WEATHER)


@pytest.mark.parametrize("tool_choice", [NAMED, "required", "auto"])
def test_streamed_tool_answers_carry_the_logprobs_asked_for(env: Env, tool_choice: Any) -> None:
    """``logprobs`` is honoured streamed as not: the same tokens, whether the text streams as
    arguments (a named function) or is held back until it is known to be a call."""
    body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=24,
                     temperature=1.0, seed=4, logprobs=True, top_logprobs=2)
    whole = env.client().chat.completions.create(**body).choices[0]
    assert whole.logprobs is not None and whole.logprobs.content
    streamed = [t for chunk in env.client().chat.completions.create(**body, stream=True) for c in chunk.choices
                if c.logprobs and c.logprobs.content for t in c.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.logprobs.content]
    assert [len(t.top_logprobs) for t in streamed] == [2] * len(streamed)


@pytest.mark.parametrize("stop", [None, "stop-from-the-answer"])
def test_auto_streams_the_content_as_it_is_generated(env: Env, stop: str | None) -> None:
    """With tools and ``auto`` (what agent frameworks send on every turn) the content streams as it
    comes, held only from where a call may start; streamed, it is the whole answer's content (a
    stop string cutting it as it cuts the whole answer)."""
    body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=1.0, seed=6, n=2)
    if stop:
        text = env.client().chat.completions.create(**body).choices[0].message.content or ""
        body["stop"] = [text[len(text) // 2:len(text) // 2 + 3]]
    whole = env.client().chat.completions.create(**body)
    chunks = list(env.client().chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert [c.delta.role for c in chunks[0].choices] == ["assistant"] and chunks[-1].usage is not None
    for choice in whole.choices:
        assert not choice.message.tool_calls and choice.message.content
        deltas = [c.delta.content for ch in chunks for c in ch.choices if c.index == choice.index and c.delta.content]
        assert len(deltas) > 1 and "".join(deltas) == choice.message.content
        assert [c.finish_reason for ch in chunks for c in ch.choices
                if c.index == choice.index and c.finish_reason] == [choice.finish_reason]
    assert not stop or whole.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_the_length_limit_is_no_content(env: Env, stream: bool) -> None:
    """Cut short, a forced call keeps finish_reason length and never turns into content: a named
    function's call carries the arguments so far, ``required`` only calls generated whole."""
    client = env.client()
    for choice, max_tokens, whole in ((NAMED, 6, 0), ("required", 6, 0), ("required", 60, 1)):
        body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens,
                         temperature=0)
        content, finish, got = _first_choice(client, body, stream)
        assert finish == "length" and content == ""
        if choice == NAMED:  # the arguments so far
            assert len(got) == 1 and got[0][0] == "get_weather" and got[0][1].startswith("{")
        else:  # the calls generated whole, the cut one left out
            assert len(got) == whole
            for name, args in got:
                jsonschema.validate(json.loads(args), SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_forced_call_cut_by_a_stop_string_is_no_call(env: Env, stream: bool, tool_choice: Any) -> None:
    """A stop string that cuts a forced call's JSON ends the answer with finish_reason stop, never
    tool_calls with arguments that are not JSON, and the grammar's text never becomes content."""
    body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=60,
                     temperature=0, stop=['"'])  # the JSON's first key opens with one: cut right there
    content, finish, got = _first_choice(env.client(), body, stream)
    assert finish == "stop" and content == ""
    if tool_choice == NAMED:  # the arguments so far, as a length cut gives them
        assert got == [("get_weather", "{")]
    else:  # no call was generated whole
        assert got == []


def test_a_cut_required_array_keeps_the_calls_generated_whole() -> None:
    plan = ToolPlan(TOOLS, "required", None, parallel=True, parser="hermes")
    cut = '[ {"name": "get_time", "parameters": {"zone": "utc"}} ,\n{"name": "get_weather", "parameters": {"ci'
    assert [(c.name, json.loads(c.arguments)) for c in plan.cut_calls(cut)] == [("get_time", {"zone": "utc"})]
    assert plan.cut_calls('[{"name": "get_ti') == [] and plan.cut_calls("") == []
    message, finish = tools.message(plan, cut, "length")
    assert finish == "length" and message.content is None and len(message.tool_calls or []) == 1


def test_tool_role_messages_are_accepted(env: Env) -> None:
    messages: list[Any] = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    r = env.client().chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="none",
                                             max_tokens=5)
    assert r.choices[0].message.tool_calls is None


def test_a_legacy_function_call_in_the_conversation_is_a_400(env: Env) -> None:
    """An assistant message's legacy ``function_call`` is refused, as the request's ``functions`` are,
    never dropped from the prompt (the model would not see the call its result answers)."""
    messages: list[Any] = MESSAGES + [
        {"role": "assistant", "content": None, "function_call": {"name": "get_time", "arguments": '{"zone": "utc"}'}},
        {"role": "function", "name": "get_time", "content": "12:00"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    assert info.value.param == "messages[1].function_call", info.value.body


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?<=x)y"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters"),  # the tool whose schema the grammar engine cannot compile
    # a forced call is enforced by its own grammar: the request's output constraint cannot also hold
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": TIME}}}, "response_format.json_schema.schema"),
    ({"tools": TOOLS, "tool_choice": NAMED, "extra_body": {"guided_regex": "a+"}}, "guided_regex"),
])
def test_bad_tool_choice_is_a_400(env: Env, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, **kwargs)
    assert info.value.param == param, info.value.body


@pytest.mark.parametrize(("function", "param"), [
    ({"name": "get weather", "parameters": TIME}, "tools[1].function.name"),  # OpenAI's ^[a-zA-Z0-9_-]{1,64}$
    ({"name": "f" * 65}, "tools[1].function.name"),
    ({"name": "f", "parameters": {"type": "string"}}, "tools[1].function.parameters"),  # not an object's schema
    ({"name": "f", "parameters": {"type": "array", "items": {}}}, "tools[1].function.parameters"),
])
def test_a_tool_openai_refuses_is_a_400(env: Env, function: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5,
                                             tools=[TOOLS[0], {"type": "function", "function": function}])
    assert info.value.param == param, info.value.body


def test_object_schemas_without_a_type_and_absent_parameters_are_accepted(env: Env) -> None:
    fns: Any = [{"name": "a-b_1", "parameters": {"properties": {"x": {"type": "string"}}}}, {"name": "c"}]
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                             tools=[{"type": "function", "function": f} for f in fns])
    assert r.choices[0].finish_reason in ("length", "stop")


def test_parsers() -> None:
    content, calls = parse_hermes('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
                                  '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert content == "Sure.\n" and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert parse_hermes("just text") == ("just text", [])
    content, calls = parse_llama3('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
                                  '{"name": "g", "parameters": {}}')
    assert content is None and [c.name for c in calls] == ["f", "g"]
    assert parse_llama3("hello {") == ("hello {", [])
    content, calls = parse_mistral('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 2}}]')
    assert content is None and calls[0].name == "f" and json.loads(calls[0].arguments) == {"a": 2}
    assert choose_parser("auto", "{{ '[TOOL_CALLS]' }}") == "mistral"
    assert choose_parser("auto", "<|python_tag|>") == "llama3"
    assert choose_parser("auto", None) == "hermes"


def test_auto_mode_parses_with_the_deployment_parser() -> None:
    plan = ToolPlan(TOOLS, "auto", None, parallel=False, parser="hermes")
    assert plan.grammar() is None
    content, calls = plan.parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>'
                                '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert content is None and [c.name for c in calls] == ["f"]  # parallel_tool_calls false: the first
    message, finish = tools.message(plan, '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', "stop")
    assert finish == "tool_calls" and message.tool_calls and message.tool_calls[0].function.name == "f"
    message, finish = tools.message(plan, "plain answer", "stop")
    assert finish == "stop" and message.content == "plain answer"


# Mistral's chat templates refuse a call id sent back that is not 9 alphanumeric characters.
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message.tool_calls %}{{- '[TOOL_CALLS] [' }}"
    "{%- for call in message.tool_calls %}{%- if not call.id is defined or call.id|length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- call.function|tojson }}{%- endfor %}{{- ']' + eos_token }}"
    "{%- else %}{{- '[INST] ' + (message.content or '') + '[/INST]' }}{%- endif %}{%- endfor %}"
)


@pytest.mark.parametrize("stream", [False, True])
def test_a_mistral_deployments_call_ids_go_back_through_its_template(tmp_path: Path, stream: bool) -> None:
    """With the ``mistral`` parser (picked from the template's markers) call ids are 9 alphanumeric
    characters, as vLLM's Mistral parser makes them: the answer, sent back, renders."""
    folder = build_tiny_model(tmp_path / "mistral", seed=5, max_position_embeddings=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": MISTRAL_TEMPLATE}))
    with local_gateway(tmp_path, model=str(folder)) as served:
        client = served.client()
        body: Any = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0)
        for choice in (NAMED, "required"):
            if stream:
                ids = [d.id for ch in client.chat.completions.create(**body, tool_choice=choice, stream=True)
                       for c in ch.choices for d in c.delta.tool_calls or [] if d.id]
            else:
                answer = client.chat.completions.create(**body, tool_choice=choice).choices[0].message
                ids = [c.id for c in answer.tool_calls or []]
            assert ids and all(re.fullmatch("[A-Za-z0-9]{9}", i) for i in ids), ids
            calls = [{"id": i, "type": "function", "function": {"name": "get_time", "arguments": "{}"}} for i in ids]
            history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": calls},
                                  {"role": "tool", "tool_call_id": ids[0], "content": "12:00"}]
            client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=2)


def test_anthropic_messages_tools_map_onto_the_same_machinery(env: Env) -> None:
    import anthropic

    from tests.support.local_gateway import KEY

    client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
    tools: Any = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    msg = client.messages.create(model="tiny", max_tokens=200, messages=[{"role": "user", "content": "Paris?"}],
                                 tools=tools, tool_choice={"type": "tool", "name": "get_weather"})
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)
    with client.messages.stream(model="tiny", max_tokens=200, messages=[{"role": "user", "content": "Paris?"}],
                                tools=tools, tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and streamed
    jsonschema.validate(streamed[0].input, WEATHER)


def _first_choice(client: openai.OpenAI, body: Any, stream: bool) -> tuple[str, str | None, list[tuple[str, str]]]:
    """The answer's content, finish reason and (name, arguments) of each call, whole or streamed."""
    if not stream:
        answer = client.chat.completions.create(**body).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in answer.message.tool_calls or []]
        return answer.message.content or "", answer.finish_reason, calls
    content, finish, streamed = "", None, {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                name, args = streamed.get(d.index, ("", ""))
                streamed[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
            finish = c.finish_reason or finish
    return content, finish, list(streamed.values())


ALLOWED: Any = {"type": "allowed_tools", "allowed_tools": {
    "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}


def test_allowed_tools_restricts_the_calls_to_the_tools_it_allows(env: Env) -> None:
    """``allowed_tools`` (chat's, and the Responses API's through its translation) is a choice among
    the tools it lists, in its mode: here ``required``, so every call is of ``get_time``, valid."""
    r = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=ALLOWED,
                                             max_tokens=300, temperature=1.0, seed=3)
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:
        assert call.function.name == "get_time"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), TIME)  # type: ignore[union-attr]
    response = env.client().responses.create(
        model="tiny", input="Weather in Paris?", max_output_tokens=300, temperature=1.0,
        tools=[{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"],
                "strict": True} for t in TOOLS],
        tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]})
    assert response.output and {item.type for item in response.output} == {"function_call"}
    assert {item.name for item in response.output} == {"get_time"}  # type: ignore[union-attr]


@pytest.mark.parametrize(("allowed", "param"), [
    ({"mode": "required", "tools": [{"type": "function", "function": {"name": "nope"}}]},
     "tool_choice.allowed_tools.tools[0]"),
    ({"mode": "sometimes", "tools": [{"type": "function", "function": {"name": "get_time"}}]},
     "tool_choice.allowed_tools"),
    ({"mode": "auto", "tools": []}, "tool_choice.allowed_tools"),
])
def test_a_bad_allowed_tools_choice_is_a_400_naming_it(env: Env, allowed: dict[str, Any], param: str) -> None:
    choice: Any = {"type": "allowed_tools", "allowed_tools": allowed}
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, tools=TOOLS,
                                             tool_choice=choice)
    assert info.value.param == param, info.value.body
