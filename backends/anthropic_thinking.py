"""Extended thinking's blocks on the chat side, as LiteLLM carries them: ``thinking_blocks``.

Anthropic requires an assistant turn with ``tool_use`` blocks to be sent back, while thinking is on,
with the thinking blocks it came with, each unchanged (a ``thinking`` block's ``signature``, a
``redacted_thinking`` block's ``data``). ``reasoning_content`` carries the text alone, so an answer's
message also carries the blocks as they came (``thinking_blocks``), a stream's deltas their pieces
(LiteLLM's shapes: a ``thinking_delta`` is ``{"type": "thinking", "thinking": piece, "signature": ""}``,
a ``signature_delta`` ``{"type": "thinking", "thinking": "", "signature": sig}``, a redacted block
one delta with the block), and an assistant message sent back with them has them sent first in its turn.
"""

from __future__ import annotations

from typing import Any

from backends.base import BadRequest
from backends.openai_wire import ChatDelta, ChatMessage

THINKING_TYPES = ("thinking", "redacted_thinking")
_FIELDS = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}  # each a string


def answer_blocks(content: Any) -> list[dict[str, Any]]:
    """The thinking and redacted thinking blocks of an answer's ``content``, as they came."""
    return [b for b in content or [] if isinstance(b, dict) and b.get("type") in THINKING_TYPES]


def request_blocks(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """The ``thinking_blocks`` of ``messages[index]``, checked, to send first in its turn as they are:
    each an object of type ``thinking`` (string ``thinking`` and ``signature``) or ``redacted_thinking``
    (string ``data``); anything else is a 400 naming it."""
    blocks = message.thinking_blocks
    if not isinstance(blocks, list) or not blocks:
        return []
    param = f"messages[{index}].thinking_blocks"
    if message.role != "assistant":
        raise BadRequest(f"thinking_blocks are accepted only in an assistant message, not in a {message.role} "
                         "message", param=param)
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise BadRequest("a thinking block must be an object", param=f"{param}[{j}]")
        fields = _FIELDS.get(block.get("type"))  # type: ignore[arg-type]
        if fields is None:
            raise BadRequest(f"a thinking block's type must be one of {', '.join(THINKING_TYPES)}",
                             param=f"{param}[{j}].type")
        for name in fields:
            if not isinstance(block.get(name), str):
                raise BadRequest(f"a {block['type']} block's {name} must be a string (as the answer gave it)",
                                 param=f"{param}[{j}].{name}")
    return blocks


def thinking_delta(delta: dict[str, Any]) -> ChatDelta | None:
    """The chat delta of a ``content_block_delta``'s thinking piece or signature; None for other deltas."""
    if delta.get("type") == "thinking_delta":
        piece = str(delta.get("thinking") or "")
        return ChatDelta(reasoning_content=piece,
                         thinking_blocks=[{"type": "thinking", "thinking": piece, "signature": ""}])
    if delta.get("type") == "signature_delta":
        signature = str(delta.get("signature") or "")
        return ChatDelta(thinking_blocks=[{"type": "thinking", "thinking": "", "signature": signature}])
    return None


def redacted_delta(block: dict[str, Any]) -> ChatDelta | None:
    """The chat delta of a ``content_block_start`` of a redacted thinking block (it comes whole); None
    for other blocks."""
    return ChatDelta(thinking_blocks=[block]) if block.get("type") == "redacted_thinking" else None
