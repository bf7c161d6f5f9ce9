"""OpenAI's rules for a conversation, checked before a chat template renders it.

A chat template renders whatever it is given: a user message with ``content: null`` as an empty
turn, a tool result with no ``tool_call_id`` (or one that answers no call) as an unattributed
result. OpenAI refuses each with a 400 naming the message's field; so does the built-in engine,
rather than answer a garbled prompt. (HTTP upstreams get the conversation as sent and decide.)
"""

from __future__ import annotations

from msgspec import UNSET

from backends.base import BadRequest
from backends.openai_wire import ChatMessage

_MISSING = "missing_required_parameter"


def check_conversation(messages: list[ChatMessage]) -> None:
    """Raise a ``BadRequest`` naming the first message that breaks one of OpenAI's rules: content
    (not null, not an empty list) on every message but an assistant's with tool calls; a tool
    message's ``tool_call_id``, answering a call an earlier assistant message made; a function
    message's ``name``."""
    called: set[str] = set()
    unnamed_calls = False  # an answer's calls without ids (some providers give none): any id may answer one
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.role == "assistant":
            _check_assistant(message, where)
            for call in message.tool_calls or []:
                if isinstance(call.id, str) and call.id:
                    called.add(call.id)
                else:
                    unnamed_calls = True
            continue
        if message.content is None:
            raise BadRequest(f"a {message.role} message needs content: a string or a list of content parts, "
                             "not null", param=f"{where}.content", code=_MISSING)
        if isinstance(message.content, list) and not message.content:
            raise BadRequest(f"a {message.role} message's content cannot be an empty list",
                             param=f"{where}.content")
        if message.role == "tool":
            _check_tool_result(message, where, called, unnamed_calls)
        elif message.role == "function" and not message.name:
            raise BadRequest("a function message needs the name of the function it answers",
                             param=f"{where}.name", code=_MISSING)


def _check_assistant(message: ChatMessage, where: str) -> None:
    has_call = bool(message.tool_calls) or message.function_call not in (None, UNSET)
    if message.content is None and not has_call:
        raise BadRequest("an assistant message needs content or tool_calls", param=f"{where}.content",
                         code=_MISSING)


def _check_tool_result(message: ChatMessage, where: str, called: set[str], unnamed_calls: bool) -> None:
    tool_call_id = message.tool_call_id
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise BadRequest("a tool message needs the tool_call_id of the call it answers",
                         param=f"{where}.tool_call_id", code=_MISSING)
    if tool_call_id not in called and not unnamed_calls:
        raise BadRequest(f"tool_call_id {tool_call_id!r} answers no tool call of an earlier assistant message",
                         param=f"{where}.tool_call_id")
