"""The first field of a request part that its Structs do not model, for a dialect that translates
the part to chat (Anthropic's Messages, OpenAI's Responses): the translation reads the Structs alone,
so such a field would be dropped without a word; it is refused with a 400 naming it instead. Only
the part is read as its Structs hold it: free-form objects (``dict[str, Any]``: a JSON schema, a
tool's input) are not looked into."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import Struct


def unmodelled_field(raw: Any, value: Any, where: str,
                     ignored: Mapping[type, frozenset[str]] | None = None) -> str | None:
    """The path (``messages[0].content[1].citations``) of the first field of ``raw``, the JSON that
    ``value`` was converted from (at ``where``), that ``value``'s Structs do not model, at any depth;
    None when there is none. A field sent as null asks for nothing, and so do those ``ignored`` names
    for a Struct type (an answer's fields, on an item a client sends back as it came)."""
    if isinstance(value, list) and isinstance(raw, list):
        for i, (sent, item) in enumerate(zip(raw, value, strict=False)):
            if found := unmodelled_field(sent, item, f"{where}[{i}]", ignored):
                return found
        return None
    if not (isinstance(value, Struct) and isinstance(raw, dict)):
        return None
    fields = {f.encode_name: f.name for f in msgspec.structs.fields(value)}
    passed = (ignored or {}).get(type(value), frozenset())
    for key, item in raw.items():
        if key == value.__struct_config__.tag_field or item is None or key in passed:
            continue
        if key not in fields:
            return f"{where}.{key}"
        if found := unmodelled_field(item, getattr(value, fields[key]), f"{where}.{key}", ignored):
            return found
    return None
