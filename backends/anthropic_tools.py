"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` as the Messages API's
``tools`` and ``tool_choice``: ``auto``, ``required`` (Anthropic's ``any``), ``none`` and a named
function (``tool``, one among the tools) map one to one; ``allowed_tools`` sends only the tools it allows, in its mode
(``auto``, or ``required`` as ``any``), as the built-in engine renders them; ``parallel_tool_calls:
false`` is ``disable_parallel_tool_use``.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from backends.base import BadRequest
from backends.function_tools import allowed_tools, function_def
from backends.openai_wire import ChatCompletionRequest, Tool

_PROVIDER = "the anthropic provider"  # as the 400s for what it cannot take name it
_MODES = {"auto": "auto", "required": "any", "none": "none"}  # OpenAI's -> Anthropic's tool_choice type


def add_tools(request: ChatCompletionRequest, body: dict[str, Any]) -> None:
    """Put ``request``'s tools and tool choice in the Messages API ``body`` (a 400 naming what is wrong)."""
    tools = list(enumerate(request.tools or []))
    choice = request.tool_choice
    sent: dict[str, Any] | None = None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        names = [function_def(t, i, _PROVIDER).name for i, t in tools]
        mode, allowed = allowed_tools(choice.get("allowed_tools"), names)
        tools = [(i, t) for i, t in tools if names[i] in allowed]
        sent = {"type": _MODES[mode]}
    elif choice not in (None, UNSET):
        sent = _tool_choice(choice)
        offered = {function_def(t, i, _PROVIDER).name for i, t in tools}
        if sent["type"] == "tool" and sent["name"] not in offered:  # as the built-in engine, not left to Anthropic
            raise BadRequest(f"tool_choice names {sent['name']!r}, which is not among the tools", param="tool_choice")
    if tools:
        body["tools"] = [_tool(t, i) for i, t in tools]
    if sent is not None:
        body["tool_choice"] = sent
    if request.parallel_tool_calls is False and tools and body.get("tool_choice", {}).get("type") != "none":
        body["tool_choice"] = body.get("tool_choice", {"type": "auto"}) | {"disable_parallel_tool_use": True}


def _tool(tool: Tool, index: int) -> dict[str, Any]:
    """A function tool as Anthropic's: ``strict: true`` is its strict tool use (structured outputs,
    generally available on the Messages API: no beta header), so the schema stays enforced; a model
    without it refuses the request upstream (a 400), never a silent drop. ``strict: false`` is the default."""
    function = function_def(tool, index, _PROVIDER)
    out: dict[str, Any] = {"name": function.name, "description": function.description or "",
                           "input_schema": function.parameters or {"type": "object", "properties": {}}}
    if function.strict is True:
        out["strict"] = True
    if isinstance(tool.cache_control, dict):  # Anthropic's prompt-caching breakpoint
        out["cache_control"] = tool.cache_control
    return out


def _tool_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(choice, str):
        if (mapped := _MODES.get(choice)) is None:
            raise BadRequest(f"unsupported tool_choice {choice!r}", param="tool_choice")
        return {"type": mapped}
    function = choice.get("function") if choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not (isinstance(name, str) and name):
        raise BadRequest('tool_choice must be none, auto, required, {"type": "function", "function": {"name": ...}} '
                         'or {"type": "allowed_tools", ...}', param="tool_choice")
    return {"type": "tool", "name": name}
