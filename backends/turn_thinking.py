"""Thinking blocks the gateway itself puts on an assistant turn: those a Responses reasoning item's
``encrypted_content`` carries, restored to the chat message of the turn that follows it.

A client's own ``thinking_blocks`` (a chat request's field) go to every provider as sent; these are
the gateway's, kept off the wire in the message's ``__dict__``, so only a provider that takes them
back (Anthropic: ``anthropic_wire``) reads them and a fallback to another one never sends them. Each
group keeps its place in the turn, as interleaved thinking needs (thinking, tool_use, thinking,
tool_use come back in that order): first in the turn, or just before one of its tool calls.
"""

from __future__ import annotations

from typing import Any

from backends.openai_wire import ChatMessage

_KEY = "_turn_thinking"

# (the index of the tool call the blocks go just before, or None: first in the turn; the blocks)
Placed = list[tuple[int | None, list[dict[str, Any]]]]


def place_thinking(message: ChatMessage, blocks: list[dict[str, Any]], before_call: int | None) -> None:
    """``blocks`` added to ``message``'s turn: first in it (``before_call`` None) or just before its
    tool call ``before_call``."""
    message.__dict__.setdefault(_KEY, []).append((before_call, list(blocks)))


def placed_thinking(message: ChatMessage) -> Placed:
    """The blocks the gateway placed in ``message``'s turn, in the order they were placed."""
    placed: Placed = getattr(message, "__dict__", {}).get(_KEY, [])
    return placed
