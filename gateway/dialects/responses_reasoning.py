"""Reasoning items the gateway makes of a chat provider's reasoning text, for the Responses API served
through chat, and their ``encrypted_content`` (``include: ["reasoning.encrypted_content"]``), which
clients that do not store responses (OpenAI's Codex CLI: ``store: false``) send back with the next
turn's input in place of the reasoning text.

The blob is the gateway's own encoding, not encryption: a versioned prefix (``swy1.``) and the
base64url of a small JSON object holding the reasoning text. Nothing is hidden by it: the same text
is in the item's ``content``, shown to the same client. A blob sent back is decoded
(``decoded_reasoning``) to restore the item's text where the client left it out; one that is not
the gateway's (another provider's, or malformed) decodes to nothing and is dropped without error.
Chat has no field for earlier reasoning either way (``responses_request.ReasoningItem``).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import msgspec

# The id of a reasoning item made here from a chat provider's reasoning text: no upstream serving
# Responses knows it, so a kept conversation sent to one leaves it out (``controllers.responses``).
TRANSLATED_REASONING = "rs_sy"
# The ``include`` value asking for it, the one a translated request can honour.
ENCRYPTED_CONTENT = "reasoning.encrypted_content"
_PREFIX = "swy1."


class _Blob(msgspec.Struct, forbid_unknown_fields=True):
    text: str


def honoured_include(value: Any) -> bool:
    """Whether ``include`` asks only for what a translated answer can give (``ENCRYPTED_CONTENT``)."""
    return isinstance(value, list) and all(entry == ENCRYPTED_CONTENT for entry in value)


def asks_encrypted_content(raw: dict[str, Any]) -> bool:
    """Whether a request (as sent) asks for reasoning items' ``encrypted_content``."""
    include = raw.get("include")
    return isinstance(include, list) and ENCRYPTED_CONTENT in include


def encrypted_reasoning(text: str) -> str:
    """``text`` as a reasoning item's ``encrypted_content``."""
    data = msgspec.json.encode(_Blob(text=text))
    return _PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def decoded_reasoning(blob: Any) -> str | None:
    """The reasoning text of an ``encrypted_content`` the gateway made; None for any other value."""
    if not isinstance(blob, str) or not blob.startswith(_PREFIX):
        return None
    body = blob[len(_PREFIX):]
    try:
        data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return msgspec.json.decode(data, type=_Blob).text
    except (binascii.Error, ValueError, msgspec.DecodeError):  # ValidationError is a DecodeError
        return None


def reasoning_of(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` parts, joined."""
    return "".join(str(part.get("text", "")) for part in item.get("content") or []
                   if isinstance(part, dict) and part.get("type") == "reasoning_text")


def with_encrypted_content(item: dict[str, Any]) -> dict[str, Any]:
    """A reasoning item made here, its ``encrypted_content`` set from its text (in place)."""
    item["encrypted_content"] = encrypted_reasoning(reasoning_of(item))
    return item


def restored(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as ``input_items`` keeps it (changed in place): where its ``encrypted_content``
    is the gateway's, its text restored if the client left it out and an id marking it as the
    gateway's if it has none; any other item as it came."""
    if item.get("type") != "reasoning" or (text := decoded_reasoning(item.get("encrypted_content"))) is None:
        return item
    if not item.get("content"):
        item["content"] = [{"type": "reasoning_text", "text": text}]
    item.setdefault("id", TRANSLATED_REASONING + uuid.uuid4().hex)
    return item
