"""Name the mapping key in a config error's path.

msgspec says where a value failed as ``prices[...].input_per_million``: for a value of a mapping it
gives ``[...]``, not the key. ``name_keys`` finds the key by converting the document again with that
mapping cut down to one entry at a time (only on an error, so the cost does not matter):
``prices.gpt-4o.input_per_million``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

_SEGMENT = re.compile(r"\[(\d+)\]|\[\.\.\.\]|\.?([^.\[]+)")
Segment = tuple[str, Any]  # ("field", name) | ("index", i) | ("key", key) | ("any", None)


def _parse(where: str) -> list[Segment]:
    segments: list[Segment] = []
    for m in _SEGMENT.finditer(where):
        if m.group(1) is not None:
            segments.append(("index", int(m.group(1))))
        elif m.group(2) is not None:
            segments.append(("field", m.group(2)))
        else:
            segments.append(("any", None))
    return segments


def _render(segments: list[Segment]) -> str:
    out = ""
    for kind, value in segments:
        out += f"[{value}]" if kind == "index" else "[...]" if kind == "any" else f".{value}" if out else str(value)
    return out


def _at(node: Any, segments: list[Segment]) -> Any:
    for kind, value in segments:
        if kind == "index" and isinstance(node, list) and 0 <= value < len(node):
            node = node[value]
        elif kind in ("field", "key") and isinstance(node, dict) and value in node:
            node = node[value]
        else:
            return None
    return node


def name_keys(raw: Any, where: str, failure: Callable[[Any], str | None]) -> str:
    """``where`` with each ``[...]`` replaced by the key whose value fails; ``failure(doc)`` is the
    path of ``doc``'s first error (None: none). Left as it is where the key cannot be found."""
    if "[...]" not in where:
        return where
    segments = _parse(where)
    while ("any", None) in segments:
        i = segments.index(("any", None))
        mapping = _at(raw, segments[:i])
        if not isinstance(mapping, dict):
            break
        prefix = _render([("any", None) if kind == "key" else (kind, v) for kind, v in segments[: i + 1]])
        for key in list(mapping):
            trial = copy.deepcopy(raw)
            _at(trial, segments[:i]).clear()
            _at(trial, segments[:i])[key] = mapping[key]
            found = failure(trial)
            if found is not None and found.startswith(prefix):
                segments[i], raw = ("key", key), trial  # the next [...] is looked for in this entry alone
                break
        else:
            break
    return _render(segments)
