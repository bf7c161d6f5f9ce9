"""Tool-call parsers: a model's generated text -> (content, calls), one per output format.

``hermes`` (Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), ``llama3``
(Llama 3.x JSON: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
separated by ``;``) and ``mistral`` (``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``).
``auto`` picks one from the chat template's own markers (hermes when it has none). The content
before a call is the text before its marker as generated (as vLLM's, not stripped), so a stream
that sent it as it came agrees with the whole answer; ``None`` when there is none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text


def _call(obj: Any) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> tuple[str | None, list[ParsedCall]]:
    if "<tool_call>" not in text:
        return text, []
    calls = []
    for body in _HERMES.findall(text):
        try:
            call = _call(json.loads(body))
        except json.JSONDecodeError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    content = text[: text.index("<tool_call>")]  # as vLLM: not stripped (it streams as generated)
    return content or None, calls


def parse_llama3(text: str) -> tuple[str | None, list[ParsedCall]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return text, []
        call = _call(obj)
        if call is None:
            return text, []
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    return None, calls


def parse_mistral(text: str) -> tuple[str | None, list[ParsedCall]]:
    if "[TOOL_CALLS]" not in text:
        return text, []
    head, _, tail = text.partition("[TOOL_CALLS]")
    try:
        obj = json.loads(tail.strip())
    except json.JSONDecodeError:
        return text, []
    calls = [_call(o) for o in (obj if isinstance(obj, list) else [obj])]
    if any(c is None for c in calls):
        return text, []
    return head or None, [c for c in calls if c is not None]  # as vLLM: not stripped


PARSERS: dict[str, Callable[[str], tuple[str | None, list[ParsedCall]]]] = {
    "hermes": parse_hermes,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
}


def choose_parser(name: str, chat_template: str | None) -> str:
    """``name`` as configured, or for ``auto`` the one the chat template's markers point at."""
    if name != "auto":
        if name not in PARSERS:
            raise ValueError(f"unknown tool_call_parser {name!r} (auto, {', '.join(PARSERS)})")
        return name
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "hermes"
