"""OpenAI's legacy function calling (``functions``, ``function_call``; deprecated, still sent by older
clients) for the Anthropic translation, as the tool calling it was replaced by.

A request's ``functions`` become its ``tools`` and ``function_call`` its ``tool_choice`` (one call
at a time, as the legacy answer holds one); an assistant message's ``function_call`` becomes a tool
call with an id derived from the message's place (``call_fn_<index>``), and a ``function`` message
the result of the call before it. A request that used ``functions`` is answered in their shape:
``message.function_call`` (streamed: ``delta.function_call``), finish reason ``function_call``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from backends.base import BadRequest
from backends.openai_wire import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    extra_params,
    set_extra_params,
)
from backends.tools_wire import FunctionDef, Tool, ToolCall

LEGACY_FIELDS = ("functions", "function_call")


def uses_functions(request: ChatCompletionRequest) -> bool:
    """Whether ``request`` offers legacy ``functions`` (its answer then takes their shape)."""
    return _field(request, "functions") is not None


def _field(request: ChatCompletionRequest, name: str) -> Any:
    """A legacy field's value (None: not sent, or null)."""
    raw = extra_params(request).get(name)
    return None if raw is None else msgspec.json.decode(raw)


def as_tools(request: ChatCompletionRequest) -> ChatCompletionRequest:
    """``request`` with its legacy function calling as tool calling (a copy; itself when it has none)."""
    extra = extra_params(request)
    legacy = any(m.role == "function" or m.function_call not in (UNSET, None) for m in request.messages)
    if not legacy and not any(name in extra for name in LEGACY_FIELDS):
        return request
    out = msgspec.structs.replace(request, messages=_messages(request.messages))
    set_extra_params(out, {name: value for name, value in extra.items() if name not in LEGACY_FIELDS})
    functions, choice = _field(request, "functions"), _field(request, "function_call")
    if functions is not None:
        if request.tools:
            raise BadRequest("give either functions (legacy) or tools, not both", param="functions")
        out.tools = _tools(functions)
        out.parallel_tool_calls = False  # the legacy answer holds one call
    if choice is not None:
        if functions is None or request.tool_choice not in (UNSET, None):
            raise BadRequest("function_call goes only with functions, and not with tool_choice",
                             param="function_call")
        out.tool_choice = _tool_choice(choice, {tool.function.name for tool in out.tools or []
                                                if tool.function is not UNSET})
    return out


def _tools(functions: Any) -> list[Tool]:
    try:
        return [Tool(function=f) for f in msgspec.convert(functions, list[FunctionDef])]
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid functions: {exc}", param="functions") from None


def _tool_choice(choice: Any, offered: set[str]) -> str | dict[str, Any]:
    if choice in ("none", "auto"):
        return str(choice)
    if isinstance(choice, dict) and isinstance(name := choice.get("name"), str) and name:
        if name not in offered:  # named as the client sent it, not as the tool_choice it becomes
            raise BadRequest(f"function_call names {name!r}, which is not among the functions",
                             param="function_call")
        return {"type": "function", "function": {"name": name}}
    raise BadRequest("function_call must be 'none', 'auto' or {\"name\": ...}", param="function_call")


def _messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Assistant ``function_call``s as tool calls, ``function`` messages as their results."""
    out, pending = [], None  # pending: the id of the last call not yet answered
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.function_call not in (UNSET, None):
            pending = f"call_fn_{i}"
            call = ToolCall(id=pending, function=message.function_call)
            message = msgspec.structs.replace(message, function_call=UNSET,
                                              tool_calls=[*(message.tool_calls or []), call])
        elif message.role == "function" and message.tool_call_id is UNSET:
            if pending is None:
                raise BadRequest(f"messages[{i}]: a function message must follow an assistant message's "
                                 "function_call", param=f"messages[{i}]")
            message = msgspec.structs.replace(message, role="tool", tool_call_id=pending)
            pending = None
        out.append(message)
    return out


def as_function_call(response: ChatCompletion) -> None:
    """An answer to a request that used ``functions``, put in their shape."""
    for choice in response.choices:
        _to_function_call(choice.message)
        if choice.finish_reason == "tool_calls":
            choice.finish_reason = "function_call"


def _to_function_call(message: AssistantMessage) -> None:
    if message.tool_calls:
        function = message.tool_calls[0].function
        if function is not UNSET:
            message.function_call = function
        message.tool_calls = UNSET


def function_call_delta(delta: ChatDelta, finish: str | None) -> tuple[ChatDelta, str | None]:
    """A streamed delta and finish reason, for a request that used ``functions``."""
    if delta.tool_calls:
        function = delta.tool_calls[0].function
        if function is not UNSET:
            delta.function_call = function
        delta.tool_calls = UNSET
    return delta, "function_call" if finish == "tool_calls" else finish
