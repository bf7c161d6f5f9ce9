"""Streaming ``tool_choice: auto``: an output's content goes out as it is generated, held back only
from where a tool call may start (as vLLM's ``extract_tool_calls_streaming``).

Each format says how much of the text so far cannot be (the start of) a call: ``hermes`` and
``mistral`` hold from their marker (``<tool_call>``, ``[TOOL_CALLS]``) or from a trailing partial
prefix of it (``<tool_``), ``llama3`` holds an output whose first non-blank text is ``{`` or
``<|python_tag|>`` (or could still become it). At the end the held text is parsed with the format's
whole-answer parser, so the content streamed is always the whole answer's ``message.content``.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.local.tool_parsers import ParsedCall

_PYTHON_TAG = "<|python_tag|>"


def _held_from_marker(marker: str) -> Callable[[str], int]:
    """Where ``text`` may start a call: the marker's first occurrence, else a trailing prefix of it."""

    def safe_end(text: str) -> int:
        at = text.find(marker)
        if at >= 0:
            return at
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:k]):
                return len(text) - k
        return len(text)

    return safe_end


def _llama3_safe_end(text: str) -> int:
    """Llama 3.x JSON calls are the whole output: hold it while its first non-blank text is, or may
    still become, ``{`` or ``<|python_tag|>``."""
    head = text.lstrip()
    if not head or head.startswith(("{", _PYTHON_TAG)) or _PYTHON_TAG.startswith(head):
        return 0
    return len(text)


SAFE_ENDS: dict[str, Callable[[str], int]] = {
    "hermes": _held_from_marker("<tool_call>"),
    "llama3": _llama3_safe_end,
    "mistral": _held_from_marker("[TOOL_CALLS]"),
}


class StreamingToolParser:
    """One output's text in ``auto`` mode: ``feed`` each delta and send what it returns as content;
    ``finish`` gives the rest of the content and the calls (``parse``: the whole-answer parser)."""

    def __init__(self, parser: str, parse: Callable[[str], tuple[str | None, list[ParsedCall]]]) -> None:
        self.name = parser
        self._safe_end = SAFE_ENDS[parser]
        self._parse = parse
        self.text = ""
        self.sent = 0  # how much of ``text`` has gone out as content

    def feed(self, delta_text: str) -> str:
        """The content that is safe to send now (empty while it is held)."""
        self.text += delta_text
        end = max(self.sent, self._safe_end(self.text))
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self, parse: bool = True) -> tuple[str, list[ParsedCall]]:
        """The held text as content when it is no call (or ``parse`` is false: an output cut by the
        length limit is content, as the whole answer has it), else no more content and the calls."""
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        if not parse:
            return rest, []
        content, calls = self._parse(self.text)
        if not calls:
            return rest, []
        assert (content or "") == self.text[: len(self.text) - len(rest)], "content streamed past a call"
        return "", calls
