"""Reasoning items the gateway makes of a chat provider's reasoning text, for the Responses API served
through chat, and their ``encrypted_content`` (``include: ["reasoning.encrypted_content"]``), which
clients that do not store responses (OpenAI's Codex CLI: ``store: false``) send back with the next
turn's input in place of the reasoning text.

The blob is the gateway's own encoding, not encryption: a versioned prefix (``swy1.``) and the
base64url of a small JSON object holding the reasoning text and, where the answer carried them
(Anthropic's extended thinking, as ``backends.anthropic_thinking`` gives them), its
``thinking_blocks`` exactly as they came, signatures and redacted blocks included; a blob made
before blocks were kept (text alone) reads the same. Nothing is hidden by it: the same text is in
the item's ``content``, shown to the same client. A blob sent back is decoded (``decoded_reasoning``,
``decoded_blocks``) to restore the item's text where the client left it out, and its blocks to the
assistant turn that follows it (``responses_request``), which Anthropic needs to continue a tool call
while thinking; chat has no field for the text itself. One that is not the gateway's (another
provider's, or malformed) decodes to nothing and is dropped without error. A stored conversation keeps
the blocks in its reasoning items whether ``include`` asked for them or not (``kept_output``).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

# The id of a reasoning item made here from a chat provider's reasoning text: no upstream serving
# Responses knows it, so a kept conversation sent to one leaves it out (``controllers.responses``).
TRANSLATED_REASONING = "rs_sy"
# The ``include`` value asking for it, the one a translated request can honour.
ENCRYPTED_CONTENT = "reasoning.encrypted_content"
_PREFIX = "swy1."


class _Blob(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    text: str
    thinking_blocks: list[dict[str, Any]] | UnsetType = UNSET  # the answer's, as they came


def honoured_include(value: Any) -> bool:
    """Whether ``include`` asks only for what a translated answer can give (``ENCRYPTED_CONTENT``)."""
    return isinstance(value, list) and all(entry == ENCRYPTED_CONTENT for entry in value)


def asks_encrypted_content(raw: dict[str, Any]) -> bool:
    """Whether a request (as sent) asks for reasoning items' ``encrypted_content``."""
    include = raw.get("include")
    return isinstance(include, list) and ENCRYPTED_CONTENT in include


def encrypted_reasoning(text: str, thinking_blocks: list[dict[str, Any]] | None = None) -> str:
    """``text`` (and the answer's ``thinking_blocks``, if any) as a reasoning item's ``encrypted_content``."""
    data = msgspec.json.encode(_Blob(text=text, thinking_blocks=thinking_blocks or UNSET))
    return _PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decoded(blob: Any) -> _Blob | None:
    if not isinstance(blob, str) or not blob.startswith(_PREFIX):
        return None
    body = blob[len(_PREFIX):]
    try:
        data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return msgspec.json.decode(data, type=_Blob)
    except (binascii.Error, ValueError, msgspec.DecodeError):  # ValidationError is a DecodeError
        return None


def decoded_reasoning(blob: Any) -> str | None:
    """The reasoning text of an ``encrypted_content`` the gateway made; None for any other value."""
    decoded = _decoded(blob)
    return decoded.text if decoded is not None else None


def decoded_blocks(blob: Any) -> list[dict[str, Any]] | None:
    """The thinking blocks an ``encrypted_content`` the gateway made carries, as they came; None for
    one without (text alone) and for any other value."""
    decoded = _decoded(blob)
    blocks = decoded.thinking_blocks if decoded is not None else None
    return blocks if isinstance(blocks, list) and blocks else None


def answer_blocks(value: Any) -> list[dict[str, Any]]:
    """An answer's ``thinking_blocks`` (a message's), each as it came; [] for none."""
    return [block for block in value if isinstance(block, dict)] if isinstance(value, list) else []


def joined_blocks(blocks: list[dict[str, Any]], pieces: list[Any]) -> None:
    """A stream's ``thinking_blocks`` pieces added to ``blocks`` (in place): a thinking block's text
    and signature pieces joined into the block until it is signed; a redacted block comes whole."""
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        last = blocks[-1] if blocks else None
        if piece.get("type") == "thinking" and last is not None and last.get("type") == "thinking" \
                and not last.get("signature"):
            last["thinking"] = str(last.get("thinking") or "") + str(piece.get("thinking") or "")
            last["signature"] = str(piece.get("signature") or "")
        else:
            blocks.append(dict(piece))


def reasoning_of(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` parts, joined."""
    return "".join(str(part.get("text", "")) for part in item.get("content") or []
                   if isinstance(part, dict) and part.get("type") == "reasoning_text")


def with_encrypted_content(item: dict[str, Any], thinking_blocks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A reasoning item made here, its ``encrypted_content`` set from its text and the answer's
    ``thinking_blocks`` (in place)."""
    item["encrypted_content"] = encrypted_reasoning(reasoning_of(item), thinking_blocks)
    return item


def kept_output(output: list[dict[str, Any]], blocks: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A response's output items as a stored conversation keeps them: a reasoning item with thinking
    blocks (``blocks``: by item id) with its ``encrypted_content``, asked for or not, so a continuation
    by ``previous_response_id`` sends them back; the response's own items are left as they are."""
    return [with_encrypted_content(dict(item), blocks[item["id"]]) if item.get("id") in blocks else item
            for item in output]


def restored(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as ``input_items`` keeps it (changed in place): where its ``encrypted_content``
    is the gateway's, its text restored if the client left it out and an id marking it as the
    gateway's if it has none; any other item as it came."""
    if item.get("type") != "reasoning" or (text := decoded_reasoning(item.get("encrypted_content"))) is None:
        return item
    if text and not item.get("content"):
        item["content"] = [{"type": "reasoning_text", "text": text}]
    item.setdefault("id", TRANSLATED_REASONING + uuid.uuid4().hex)
    return item
