"""Tool calling for the local engine: ``tools``, ``tool_choice`` and ``parallel_tool_calls``.

As vLLM: tools are rendered through the model's chat template; with ``auto`` the model's text is
parsed by the deployment's tool-call parser (``backends.local.tool_parsers``), streamed as it is
generated up to where a call may start (``backends.local.tool_stream``); ``required`` and a
named function are enforced with a grammar, so even a small model returns a call whose arguments
validate: a named function's output is its arguments object (its ``parameters`` schema), ``required``
an array of ``{"name", "parameters"}`` objects (one item when ``parallel_tool_calls`` is false).
``none`` renders no tools and parses nothing; ``allowed_tools`` renders only the tools it allows,
in its mode (``auto`` or ``required``). A forced call cut short by the length limit keeps
``finish_reason: length`` and has no content (the grammar's text is no answer): a named function's
call carries the arguments generated so far (as OpenAI and vLLM answer; the stream has streamed
them), ``required`` the calls generated whole, the cut one left out (vLLM answers a JSON parse error).
One cut by a stop string (or stop token id) is the same with ``finish_reason: stop``: never
``tool_calls`` over arguments that are not JSON.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from backends.base import BadRequest
from backends.function_tools import allowed_tools, function_def
from backends.local.tool_parsers import PARSERS, ParsedCall
from backends.local.tool_stream import StreamingToolParser
from backends.openai_wire import (
    AssistantMessage,
    ChatChunkChoice,
    ChatCompletionRequest,
    ChatDelta,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
)
from engine.structured_output import StructuredOutput

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's function names
_EMPTY_PARAMS = {"type": "object", "properties": {}}
_BETWEEN_ITEMS = " \t\n\r,"  # what JSON allows between an array's items
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_VALUE_KEYS = frozenset({"enum", "const", "default", "examples"})  # JSON values, not schemas


def _set(value: Any) -> bool:
    return value is not None and value is not UNSET


def _rebased(node: Any, base: str) -> Any:
    """A schema with its local references (``#`` and ``#/...``) pointing under the JSON pointer
    ``base``, where it is placed inside a larger schema; the values it holds are left alone."""
    if isinstance(node, list):
        return [_rebased(n, base) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = "#" + base + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas (a name may be "enum")
            out[key] = {name: _rebased(schema, base) for name, schema in value.items()}
        else:
            out[key] = value if key in _VALUE_KEYS else _rebased(value, base)
    return out


@dataclass
class ToolPlan:
    tools: list[dict[str, Any]]  # as the chat template expects them (OpenAI's shape)
    mode: str  # auto | required | named
    named: str | None
    parallel: bool
    parser: str
    numbers: list[int] | None = None  # each tool's place among the request's (None: the same as here)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.tools}

    def grammar(self) -> StructuredOutput | None:
        params = {t["function"]["name"]: t["function"].get("parameters") or _EMPTY_PARAMS for t in self.tools}
        if self.mode == "named":
            assert self.named is not None
            return StructuredOutput("json", json.dumps(params[self.named]), "tool_choice")
        if self.mode == "required":  # each tool's schema under $defs, its own references rebased there
            defs = {f"tool{i}": _rebased(schema, f"/$defs/tool{i}") for i, schema in enumerate(params.values())}
            item = {"anyOf": [
                {"type": "object", "properties": {"name": {"const": name}, "parameters": {"$ref": f"#/$defs/tool{i}"}},
                 "required": ["name", "parameters"], "additionalProperties": False}
                for i, name in enumerate(params)
            ]}
            array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1, "$defs": defs}
            if not self.parallel:
                array["maxItems"] = 1
            return StructuredOutput("json", json.dumps(array), "tool_choice")
        return None

    def schemas(self) -> list[StructuredOutput]:
        """The ``parameters`` schemas the grammar is built from, each naming its tool's field."""
        numbers = self.numbers or range(len(self.tools))
        return [StructuredOutput("json", json.dumps(t["function"]["parameters"]),
                                 f"tools[{n}].function.parameters")
                for n, t in zip(numbers, self.tools, strict=True)
                if self.mode != "named" or t["function"]["name"] == self.named]

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """The content and the calls in a finished output's text."""
        if self.mode == "named":
            assert self.named is not None
            return None, [ParsedCall(self.named, text.strip())]
        if self.mode == "required":
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                return text, []
            return None, [ParsedCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        content, calls = PARSERS[self.parser](text)
        if not self.parallel:
            calls = calls[:1]
        return content, calls

    def streaming(self) -> StreamingToolParser:
        """An ``auto`` output's streaming parser (its calls as ``parse`` finds them)."""
        return StreamingToolParser(self.parser, self.parse)

    def whole(self, text: str) -> bool:
        """Whether a forced call's output is its grammar's whole JSON text, not one cut short."""
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return False
        return True

    def cut_calls(self, text: str) -> list[ParsedCall]:
        """The calls in a forced call's output cut short: a named function's with the arguments
        generated so far, the items of a ``required`` array that were generated whole."""
        if self.mode == "named":
            assert self.named is not None
            return [ParsedCall(self.named, text.strip())]
        calls: list[ParsedCall] = []
        decoder, start = json.JSONDecoder(), text.find("[")
        pos = start + 1 if start >= 0 else len(text)
        while True:
            while pos < len(text) and text[pos] in _BETWEEN_ITEMS:
                pos += 1
            try:
                item, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:  # the cut item (or the array's end)
                return calls
            calls.append(ParsedCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False)))


def plan(request: ChatCompletionRequest, parser: str) -> ToolPlan | None:
    """The request's tool plan (None when it has no tools or tool_choice is ``none``); 400s name
    the field: tool_choice without tools, an unknown tool, a malformed choice, a function name
    OpenAI refuses, ``parameters`` that are not an object's schema."""
    tools = request.tools if _set(request.tools) else None
    choice = request.tool_choice if _set(request.tool_choice) else None
    if not tools:
        if choice not in (None, "none"):
            raise BadRequest("tool_choice requires tools", param="tool_choice")
        return None
    functions = [function_def(t, i, "this model") for i, t in enumerate(tools)]
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise BadRequest("tool names must be unique", param="tools")
    for i, f in enumerate(functions):
        if not _NAME.fullmatch(f.name):
            raise BadRequest("a function's name must match ^[a-zA-Z0-9_-]{1,64}$", param=f"tools[{i}].function.name")
        params = f.parameters
        if _set(params) and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            kind = f" (not type {params.get('type')!r})" if isinstance(params, dict) else ""
            raise BadRequest(f"parameters must be an object's JSON schema{kind}",
                             param=f"tools[{i}].function.parameters")
    named = None
    numbers = list(range(len(functions)))  # the tools rendered (all but where allowed_tools chooses)
    if choice is None:
        mode = "auto"
    elif isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise BadRequest("tool_choice must be none, auto, required or a named function", param="tool_choice")
        if choice == "none":
            return None
        mode = choice
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        mode, allowed = allowed_tools(choice.get("allowed_tools"), names)
        numbers = [i for i, name in enumerate(names) if name in allowed]
    elif isinstance(choice, dict):
        chosen = choice.get("function") if choice.get("type") == "function" else None
        named = chosen.get("name") if isinstance(chosen, dict) else None
        if not isinstance(named, str):
            raise BadRequest('tool_choice must be {"type": "function", "function": {"name": ...}}',
                             param="tool_choice")
        if named not in names:
            raise BadRequest(f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
        mode = "named"
    else:
        raise BadRequest("tool_choice must be none, auto, required or a named function", param="tool_choice")
    rendered = []
    for f in (functions[i] for i in numbers):
        fn: dict[str, Any] = {"name": f.name, "parameters": f.parameters if _set(f.parameters) else _EMPTY_PARAMS}
        if _set(f.description):
            fn["description"] = f.description
        rendered.append({"type": "function", "function": fn})
    parallel = request.parallel_tool_calls is not False
    return ToolPlan(rendered, mode, named, parallel, parser, numbers)


def call_id(parser: str) -> str:
    """A new call's id: OpenAI's ``call_...``, or with the ``mistral`` parser 9 alphanumeric characters,
    as vLLM's Mistral parser makes them (Mistral's chat templates refuse any other id sent back)."""
    return uuid.uuid4().hex[:9] if parser == "mistral" else "call_" + uuid.uuid4().hex[:24]


def wire_calls(calls: list[ParsedCall], parser: str) -> list[ToolCall]:
    return [ToolCall(id=call_id(parser), function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


def opening_delta(plan: ToolPlan | None, role: str, echo: str) -> ChatDelta:
    """A streamed choice's first delta, the role: ``content: ""`` for an answer that may be text,
    ``content: null`` (OpenAI's) for a forced call's, which never is (unless ``echo`` starts it)."""
    forced = plan is not None and plan.mode != "auto" and not echo
    return ChatDelta(role=role, content=None if forced else "")


def forced_finish(plan: ToolPlan, text: str, finish: Any) -> Any:
    """A forced call's wire finish reason once its output is whole: ``tool_calls`` for ``required``,
    ``stop`` for a named function (as OpenAI and vLLM answer a call the request named); else the
    engine's (``length``, or ``stop`` where a stop string or stop token id cut the JSON short)."""
    if finish == "stop" and plan.whole(text):
        return "stop" if plan.mode == "named" else "tool_calls"
    return finish


def message(plan: ToolPlan | None, text: str, finish: Any) -> tuple[AssistantMessage, Any]:
    """The assistant message for a finished output (``finish``: its wire finish reason), with its
    tool calls parsed when it has any (then the finish reason is ``tool_calls``, or ``stop`` for a
    named function's: ``forced_finish``); a forced call cut short (length limit, stop string) keeps
    that finish reason, has the calls it got whole (or, named, cut) and no content."""
    if plan is None or (finish == "length" and plan.mode == "auto"):
        return AssistantMessage(content=text), finish
    if plan.mode != "auto" and not (finish == "stop" and plan.whole(text)):
        return AssistantMessage(content=None, tool_calls=wire_calls(plan.cut_calls(text), plan.parser) or UNSET), finish
    content, calls = plan.parse(text)
    if not calls:
        return AssistantMessage(content=text), finish
    reason = forced_finish(plan, text, finish) if plan.mode != "auto" else "tool_calls"
    return AssistantMessage(content=content, tool_calls=wire_calls(calls, plan.parser)), reason


def final_deltas(plan: ToolPlan, index: int, text: str, finish: Any) -> list[ChatChunkChoice]:
    """The closing stream deltas of an output whose whole text was held back (``required``; ``auto``
    on plain ``generate``): its content, or one tool-call delta per call (id, name and the whole
    arguments), then the finish reason."""
    msg, reason = message(plan, text, finish)
    return closing_deltas(index, msg.content or "", msg.tool_calls or [], reason)


def streamed_final_deltas(parser: StreamingToolParser, index: int, finish: Any) -> list[ChatChunkChoice]:
    """An ``auto`` output's closing stream deltas once its content so far has streamed: the held
    text as content, or its calls (then the finish reason is ``tool_calls``), as ``message`` has them."""
    rest, calls = parser.finish(parse=finish != "length")
    return closing_deltas(index, rest, wire_calls(calls, parser.name), "tool_calls" if calls else finish)


def closing_deltas(index: int, content: str, calls: list[ToolCall], reason: Any) -> list[ChatChunkChoice]:
    """The content (when any), one tool-call delta per call, then the finish reason."""
    out = []
    if content:
        out.append(ChatChunkChoice(index=index, delta=ChatDelta(content=content)))
    if calls:
        deltas = [ToolCallDelta(index=i, id=c.id, type="function", function=msgspec.to_builtins(c.function))
                  for i, c in enumerate(calls)]
        out.append(ChatChunkChoice(index=index, delta=ChatDelta(tool_calls=deltas)))
    out.append(ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=reason))
    return out
