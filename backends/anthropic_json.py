"""A JSON ``response_format`` (``json_schema``, ``json_object``) for the Anthropic translation, as
gateways such as LiteLLM serve it: the Messages API is sent one tool whose ``input_schema`` is the
requested schema (``{"type": "object"}`` for ``json_object``; a ``json_schema``'s ``strict: true``
is the tool's strict tool use), forced by ``tool_choice``, and the answer's call of it is the
message's content, the JSON text, with finish reason ``stop`` (streamed: its ``input_json_delta``
pieces are content deltas). Anthropic sends no text before a forced call.

What would make the answer something else is a 400 naming ``response_format``: the request's own
tools (or legacy functions; their calls and the JSON answer would be mixed up), extended thinking
(Anthropic forces no tool with it) and a schema whose root is no object (a tool's input is one).
A deployment's ``drop_params`` listing ``response_format`` leaves it out instead.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from msgspec import UNSET

from backends.base import BadRequest
from backends.openai_wire import ChatCompletion, ChatCompletionRequest, ChatDelta, ResponseFormat

JSON_OBJECT_TOOL = "json_object"  # the tool's name for json_object (json_schema's is the schema's name)
_PARAM = "response_format"


def json_format(request: ChatCompletionRequest, dropped: Collection[str] = ()) -> ResponseFormat | None:
    """The request's JSON ``response_format``, unless it asks for text or ``dropped`` names it."""
    fmt = request.response_format
    if fmt in (UNSET, None) or fmt.type == "text" or _PARAM in dropped:
        return None
    if fmt.type == "structural_tag":  # vLLM's
        raise BadRequest("response_format type 'structural_tag' is not supported by the anthropic provider",
                         param="response_format.type")
    return fmt


def add_json_tool(fmt: ResponseFormat, body: dict[str, Any]) -> None:
    """Have the Messages API ``body`` answer ``fmt`` through one forced tool (a 400 naming
    ``response_format`` where that cannot be done faithfully)."""
    if body.get("tools"):
        raise BadRequest("response_format json_object or json_schema cannot go with tools (or functions) on the "
                         "anthropic provider: it is served as a forced tool call", param=_PARAM)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") != "disabled":
        raise BadRequest("response_format json_object or json_schema cannot go with extended thinking "
                         "(reasoning_effort, thinking) on the anthropic provider", param=_PARAM)
    tool: dict[str, Any] = {"name": JSON_OBJECT_TOOL, "description": "Answer with a JSON object.",
                            "input_schema": {"type": "object"}}
    spec = fmt.json_schema
    if fmt.type == "json_schema":
        if spec is UNSET:
            raise BadRequest("response_format json_schema needs its json_schema", param=_PARAM)
        schema = spec.schema if spec.schema is not UNSET else {"type": "object"}
        if schema.get("type") != "object":
            raise BadRequest("response_format.json_schema.schema must describe an object (type: object) on the "
                             "anthropic provider", param=_PARAM)
        tool = {"name": spec.name, "description": spec.description or f"Answer with {spec.name} as JSON.",
                "input_schema": schema} | ({"strict": True} if spec.strict is True else {})
    body["tools"] = [tool]
    body["tool_choice"] = {"type": "tool", "name": tool["name"]}


def as_json_answer(response: ChatCompletion) -> None:
    """An answer through the forced tool, as a JSON answer: its call's arguments are the content."""
    for choice in response.choices:
        message = choice.message
        if message.tool_calls:
            arguments = "".join(c.function.arguments for c in message.tool_calls if c.function is not UNSET)
            message.content = (message.content or "") + arguments
            message.tool_calls = UNSET
        if choice.finish_reason == "tool_calls":
            choice.finish_reason = "stop"


def json_delta(delta: ChatDelta, finish: str | None) -> tuple[ChatDelta, str | None]:
    """A streamed delta and finish reason through the forced tool, as a JSON answer's."""
    if delta.tool_calls:
        pieces = [c.function.get("arguments") for c in delta.tool_calls if isinstance(c.function, dict)]
        delta.content = (delta.content or "") + "".join(p for p in pieces if isinstance(p, str))
        delta.tool_calls = UNSET
    return delta, "stop" if finish == "tool_calls" else finish
