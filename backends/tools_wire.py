"""OpenAI's chat tool types: function tools and custom tools (GPT-5's: free-form text input,
optionally held to a grammar), their calls in an answer or a conversation, and streamed call deltas.
A call's ``id`` and a delta's ``index`` are optional, as providers off OpenAI's schema send them.

A tool or a call carries the object its ``type`` names (``function`` or ``custom``). A backend that
serves function tools only refuses a custom one with a 400 naming it (``function_only``).
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str


class CustomCall(Struct, kw_only=True):
    """A custom tool's call: its ``input`` is free text, not JSON arguments."""

    name: str
    input: str


def _check(kind: str, function: object, custom: object) -> None:
    """Raised in ``__post_init__``, msgspec makes the error a 400 naming the missing field."""
    if (function if kind == "function" else custom) is UNSET:
        raise ValueError(f"Object missing required field `{kind}`")


class ToolCall(Struct, kw_only=True):
    # left out or null by some providers (Gemini's OpenAI-compatible API, Ollama, NIM); an answer is
    # relayed as it came, a translated one gives the call an id of the gateway's own
    id: str | None | UnsetType = UNSET
    function: FunctionCall | UnsetType = UNSET
    type: Literal["function", "custom"] = "function"
    custom: CustomCall | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check(self.type, self.function, self.custom)


class ToolCallDelta(Struct, kw_only=True):
    # left out or null by some providers (Gemini, older Ollama, mistral.rs): relayed so on plain chat;
    # the translated dialects place such deltas with ``gateway.dialects.tool_call_slots``
    index: int | None | UnsetType = UNSET
    id: str | None | UnsetType = UNSET  # null in a call's later deltas, as OpenAI's schema allows
    type: str | None | UnsetType = UNSET
    function: dict[str, Any] | UnsetType = UNSET
    custom: dict[str, Any] | UnsetType = UNSET  # a custom call's ``name`` and ``input`` text so far


class FunctionDef(Struct, kw_only=True):
    name: str
    description: str | UnsetType = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET  # null (OpenAI's schema allows it): as unset


class CustomToolDef(Struct, kw_only=True):
    name: str
    description: str | UnsetType = UNSET
    format: dict[str, Any] | UnsetType = UNSET  # {"type": "text"} or {"type": "grammar", "grammar": {...}}


class Tool(Struct, kw_only=True):
    function: FunctionDef | UnsetType = UNSET
    type: Literal["function", "custom"] = "function"
    custom: CustomToolDef | UnsetType = UNSET
    cache_control: dict[str, Any] | None | UnsetType = UNSET  # Anthropic's prompt-caching breakpoint

    def __post_init__(self) -> None:
        _check(self.type, self.function, self.custom)
