"""For backends that serve function tools only (the built-in engine, the Anthropic translation):
a custom tool, or a custom call in the conversation, is a 400 naming it, never dropped; an
``allowed_tools`` choice is read as the tools it allows. For answers
translated to an API without custom tools (``/v1/messages``, ``/v1/responses`` served by chat): a
custom call fails the answer as untranslatable."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from backends.base import BadRequest, UntranslatableAnswer
from backends.tools_wire import FunctionCall, FunctionDef, Tool, ToolCall, ToolCallDelta


def function_def(tool: Tool, index: int, backend: str) -> FunctionDef:
    """``tools[index]``'s function, or a 400 naming its type."""
    if isinstance(tool.function, FunctionDef) and tool.type == "function":
        return tool.function
    raise BadRequest(f"{backend} serves function tools only, not {tool.type} tools", param=f"tools[{index}].type",
                     code="unsupported_parameter")


def function_call(call: ToolCall, where: str, backend: str) -> FunctionCall:
    """A function call of the conversation, or a 400 naming it (``where``: ``messages[1].tool_calls[0]``)."""
    if isinstance(call.function, FunctionCall) and call.type == "function":
        return call.function
    raise BadRequest(f"{backend} serves function tools only, not {call.type} tool calls", param=where,
                     code="unsupported_parameter")


def allowed_tools(allowed: Any, names: list[str]) -> tuple[str, set[str]]:
    """An ``allowed_tools`` choice's mode (``auto`` or ``required``) and the tools it allows, each
    among the request's (``names``); the model is shown those alone, so it calls no other."""
    mode = allowed.get("mode") if isinstance(allowed, dict) else None
    listed = allowed.get("tools") if isinstance(allowed, dict) else None
    if mode not in ("auto", "required") or not isinstance(listed, list) or not listed:
        raise BadRequest('tool_choice of type allowed_tools must be {"type": "allowed_tools", "allowed_tools": '
                         '{"mode": "auto" or "required", "tools": [{"type": "function", "function": {"name": ...}}]}}',
                         param="tool_choice.allowed_tools")
    chosen: set[str] = set()
    for i, tool in enumerate(listed):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in names:
            raise BadRequest(f"tool_choice.allowed_tools.tools[{i}] must name a function among the tools",
                             param=f"tool_choice.allowed_tools.tools[{i}]")
        chosen.add(name)
    return mode, chosen


def answered_function(call: ToolCall, api: str) -> FunctionCall:
    """An upstream answer's function call, for an answer translated to ``api``: a custom tool's call
    has no twin there, so the answer fails as untranslatable (a 502), never passed off as another."""
    if isinstance(call.function, FunctionCall) and call.type == "function":
        return call.function
    raise _untranslatable(call, api)


def check_delta(call: ToolCallDelta, api: str) -> None:
    """``answered_function`` for a streamed call delta."""
    if call.type == "custom" or call.custom is not UNSET:
        raise _untranslatable(call, api)


def _untranslatable(call: ToolCall | ToolCallDelta, api: str) -> UntranslatableAnswer:
    """The failure naming ``call`` by its id, else (it has none) by its index, if any."""
    if isinstance(call.id, str) and call.id:
        named = repr(call.id)
    elif isinstance(call, ToolCallDelta) and isinstance(call.index, int):
        named = f"#{call.index}"
    else:
        named = "(with no id)"
    return UntranslatableAnswer(f"the upstream's tool call {named} is a custom tool call, which {api} cannot express")
