"""Fields of a chat request made from a Responses API request (``responses_request.to_chat_request``),
as that request names them: an error about the chat request (a provider's, the gateway's own checks)
names the field the client sent."""

from __future__ import annotations

import re

# A chat request's fields (as a provider's errors name them) and the Responses fields they came from.
_CHAT_PARAMS = (("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
                ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
                ("verbosity", "text.verbosity"), ("reasoning_effort", "reasoning.effort"),
                ("tool_choice.function", "tool_choice"), ("tool_choice.allowed_tools", "tool_choice"))
_CHAT_TOOL = re.compile(r"^tools\[(\d+)\]\.function\b")


def responses_param(param: str | None) -> str | None:
    """The Responses request's name for a field of the chat request it became (``max_tokens`` ->
    ``max_output_tokens``; any message -> ``input``, as instructions and merged tool calls shift
    the indices); a name with no known origin is kept."""
    if param is None:
        return None
    if param == "messages" or param.startswith(("messages[", "messages.")):
        return "input"
    for chat, ours in _CHAT_PARAMS:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            return ours + param[len(chat):]
    return _CHAT_TOOL.sub(r"tools[\1]", param, count=1)
