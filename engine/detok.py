"""Streaming text out of token ids: incremental detokenisation and stop strings.

``IncrementalDetokenizer`` decodes a small sliding window of ids (as vLLM does) and holds back a
token while its text ends in U+FFFD, i.e. while it is an incomplete UTF-8 sequence whose
remaining bytes are in later tokens. ``StopMatcher`` holds back the tail of the text that could
still become a stop string, so stop strings that span tokens are cut cleanly.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """``push(token_id) -> str``: the new complete text since the previous push."""

    def __init__(self, tokenizer: Decoder, prompt_ids: list[int] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids or [])
        # A few prompt tokens of left context so that leading-space rules decode as in the full text.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or an incomplete character: wait for its next bytes
        delta = full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta


class StopMatcher:
    """``feed(new_text) -> (emit, stopped)``.

    ``emit`` is text that can safely go to the client; once a stop string appears, everything
    from it onwards is dropped and ``stopped`` is True. ``flush()`` returns what was held back
    when generation ends for another reason.
    """

    def __init__(self, stop_strings: list[str] | None = None) -> None:
        self.stops = [s for s in (stop_strings or []) if s]
        self.held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the earliest in the text)

    def feed(self, new_text: str, match: bool = True) -> tuple[str, bool]:
        """With ``match=False`` (before ``min_tokens``) stop strings are not looked for, but a
        tail that could begin one is still held back, so a stop string that ends in later text
        is cut cleanly."""
        if self.stopped:
            return "", True
        if not self.stops:
            return new_text, False
        buf = self.held + new_text
        hits = [(i, s) for i, s in ((buf.find(s), s) for s in self.stops) if i >= 0] if match else []
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self.held, self.stopped = "", True
            return buf[:at], True
        keep = self._partial_tail(buf)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        out, self.held = self.held, ""
        return "" if self.stopped else out
