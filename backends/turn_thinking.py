"""Thinking blocks the gateway itself puts on an assistant turn, each group in its place there: those
a Responses reasoning item's ``encrypted_content`` carries, restored to the chat message of the turn
that follows it, and those of an Anthropic answer, on the answer's message, so the Responses API gives
each group its own reasoning item where it came.

A client's own ``thinking_blocks`` (a chat request's field) go to every provider as sent, and a chat
answer's ``thinking_blocks`` stay as they are; these are the gateway's, kept off the wire in the
message's ``__dict__``, so only a provider that takes them back (Anthropic: ``anthropic_wire``) reads
them and a fallback to another one never sends them. Each group keeps its place in the turn, as
interleaved thinking needs (thinking, tool_use, thinking, tool_use come back in that order): first in
the turn, or just before one of its tool calls.
"""

from __future__ import annotations

from typing import Any

from backends.openai_wire import AssistantMessage, ChatMessage

_KEY = "_turn_thinking"

Blocks = list[dict[str, Any]]
# (the index of the tool call the blocks go just before, or None: first in the turn; the blocks)
Placed = list[tuple[int | None, Blocks]]


def place_thinking(message: ChatMessage | AssistantMessage, blocks: Blocks,
                   before_call: int | None) -> None:
    """``blocks`` added to ``message``'s turn: first in it (``before_call`` None) or just before its
    tool call ``before_call``."""
    message.__dict__.setdefault(_KEY, []).append((before_call, list(blocks)))


def placed_thinking(message: ChatMessage | AssistantMessage) -> Placed:
    """The blocks the gateway placed in ``message``'s turn, in the order they were placed."""
    placed: Placed = getattr(message, "__dict__", {}).get(_KEY, [])
    return placed


def thinking_before(message: ChatMessage | AssistantMessage, call: int | None, calls: int) -> list[Blocks]:
    """The groups placed in ``message``'s turn (of ``calls`` tool calls) first (``call`` None) or just
    before its call ``call``; at ``call == calls``, after its last call, those placed before a call it
    does not have (thinking after the last call of an answer, or an answer's call made its text)."""
    return [group for at, group in placed_thinking(message) if (at if at is None else min(at, calls)) == call]
