"""Fields of a chat request translated from a Messages API request (``anthropic_request.translate``),
as that request names them. Anthropic's error shape has no ``param``, so an error about the chat
request (a provider's, the engine's checks) must name in its message the field the client sent:
``messages[3].content`` of the chat request may be ``messages[2].content`` (a system prompt comes
first, tool results are messages of their own), ``tools[0].function.parameters`` is
``tools[0].input_schema``, ``response_format`` is ``output_config.format``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from backends.base import BackendError

_CHAT_MESSAGE = re.compile(r"messages\[(\d+)\](.*)", re.DOTALL)
_CHAT_TOOL = re.compile(r"tools\[(\d+)\]\.function(?:\.([A-Za-z_]+))?(.*)", re.DOTALL)
_TOOL_FIELDS = {"parameters": "input_schema"}
_TOP_FIELDS = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "reasoning_effort": "output_config.effort",
}
_SCHEMA = "response_format.json_schema.schema"  # output_config.format.schema (anthropic_output)


def messages_param(param: str, origins: Sequence[str]) -> str:
    """The Messages request's name for ``param`` of its translation; ``origins[k]`` is where the
    chat request's ``messages[k]`` came from (``system`` or ``messages[i]``). Within a message only
    ``content`` is named: blocks and chat parts do not line up one to one."""
    if message := _CHAT_MESSAGE.fullmatch(param):
        k = int(message[1])
        if k >= len(origins):
            return "messages"
        origin = origins[k]
        return origin if origin == "system" or not message[2] else f"{origin}.content"
    if tool := _CHAT_TOOL.fullmatch(param):
        field = tool[2]
        return f"tools[{tool[1]}]" + (f".{_TOOL_FIELDS.get(field, field)}{tool[3]}" if field else "")
    if param.startswith(_SCHEMA):
        return "output_config.format.schema" + param.removeprefix(_SCHEMA)
    if param.startswith("response_format"):
        return "output_config.format"
    return _TOP_FIELDS.get(param, param)


def in_messages_terms(exc: BackendError, origins: Sequence[str]) -> BackendError:
    """``exc`` (its type kept) with its field named as the Messages request names it, in its message too."""
    if exc.param is None:
        return exc
    exc.param = messages_param(exc.param, origins)
    if exc.param not in exc.message:
        exc.message = f"{exc.param}: {exc.message}"
        exc.args = (exc.message,)
    return exc
