"""A JSON schema that refers to itself with nothing in between (``{"$ref": "#"}``, ``$defs`` whose
``$ref`` / ``allOf`` chain comes back to where it started) has no value that matches it: the
grammar engine compiles it, then errs on the first token it must constrain there, so the request
would fail mid-answer (after a streamed 200). ``find_cycle`` finds such a loop up front, for a 400.

A recursion through a value (``properties``, ``items``, ...) is a tree and fine; one through an
``anyOf`` / ``oneOf`` alternative is left to the grammar engine (another alternative may end it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

# keywords whose value is one schema / a list of schemas / a map of names to schemas
_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
        "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "dependentSchemas")  # $defs: reached by $ref


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local ``$ref`` (``#`` or ``#/json/pointer``) points at; None otherwise."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _children(node: dict[str, Any]) -> list[Any]:
    out: list[Any] = [node[k] for k in _ONE if isinstance(node.get(k), (dict, bool))]
    out += [s for k in _LIST if isinstance(node.get(k), list) for s in node[k]]
    out += [s for k in _MAP if isinstance(node.get(k), dict) for s in node[k].values()]
    return [c for c in out if isinstance(c, dict)]


def _direct(root: Any, node: dict[str, Any]) -> list[dict[str, Any]]:
    """The subschemas ``node`` must match at the same place, consuming nothing: its ``$ref`` and
    its ``allOf`` items."""
    out = []
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        if isinstance(target, dict):
            out.append(target)
    all_of = node.get("allOf")
    if isinstance(all_of, list):
        out += [s for s in all_of if isinstance(s, dict)]
    return out


def find_cycle(root: Any) -> str | None:
    """The ``$ref`` of a loop with nothing in between in the part of ``root`` a value can reach
    (iteratively: schemas may be deep), or None."""
    if not isinstance(root, dict):
        return None
    seen: set[int] = set()
    nodes: list[dict[str, Any]] = []
    stack = [root]
    while stack:  # every subschema reachable from the root, through references too
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack += _children(node) + _direct(root, node)
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if id(start) in state:
            continue
        path: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [(start, _direct(root, start))]
        state[id(start)] = 1
        while path:
            node, todo = path[-1]
            if not todo:
                state[id(node)] = 2
                path.pop()
                continue
            nxt = todo.pop()
            if state.get(id(nxt)) == 1:
                ref = node.get("$ref")
                return ref if isinstance(ref, str) else "allOf"
            if id(nxt) not in state:
                state[id(nxt)] = 1
                path.append((nxt, _direct(root, nxt)))
    return None
