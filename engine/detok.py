"""Streaming text out of token ids: incremental detokenisation and stop strings.

``IncrementalDetokenizer`` decodes a small sliding window of ids (as vLLM does) and holds back a
token while its text ends in U+FFFD, i.e. while it is an incomplete UTF-8 sequence whose
remaining bytes are in later tokens; ``flush`` ends the text, the bytes of a character that no
token completed shown as U+FFFD, as decoding all the tokens shows them. ``StopMatcher`` holds back
the tail of the text that could still become a stop string, so stop strings that span tokens are
cut cleanly (or, when the stop string stays in the output, keeps that tail only to find one).
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

    def flush(self) -> str:
        """The text still held back when generation ends (e.g. at ``max_tokens``) after tokens that
        began a character: its bytes as U+FFFD (as in the middle of a text, where a token that does
        not continue them follows), never dropped, so the text is what decoding the tokens gives."""
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        delta = self._decode(self.ids[self.prefix_offset :])[len(prefix) :]
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta


class StopMatcher:
    """``feed(new_text) -> (emit, stopped)``.

    ``emit`` is text that can safely go to the client; once a stop string appears, ``stopped`` is
    True and the text is cut before it, or with ``include`` (vLLM's ``include_stop_str_in_output``)
    right after it. Without ``include`` the tail that could still begin a stop string is held back,
    and ``flush()`` returns it when generation ends for another reason; with ``include`` nothing is
    held back (the text up to a stop string's end is output anyway), and the emitted tail is only
    kept to find a stop string that spans tokens. As vLLM, a stop string is looked for only where it
    ends in new text.
    """

    def __init__(self, stop_strings: list[str] | None = None, include: bool = False) -> None:
        self.stops = [s for s in (stop_strings or []) if s]
        self.include = include
        self.held = ""  # the tail kept from earlier text: not yet emitted, or with ``include`` emitted
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the earliest in the text)

    def feed(self, new_text: str, match: bool = True) -> tuple[str, bool]:
        """With ``match=False`` (before ``min_tokens``) stop strings are not looked for, but a
        tail that could begin one is still kept, so a stop string that ends in later text is cut
        cleanly."""
        if self.stopped:
            return "", True
        if not self.stops:
            return new_text, False
        old = len(self.held)
        buf = self.held + new_text
        sent = old if self.include else 0  # where this call's output starts in ``buf``
        hit = self._first_hit(buf, old) if match else None
        if hit is not None:
            at, self.matched = hit
            self.held, self.stopped = "", True
            end = at + len(self.matched) if self.include else at
            return buf[sent:end], True
        keep = len(max(self.stops, key=len)) - 1 if self.include else self._partial_tail(buf)
        self.held = buf[-keep:] if keep else ""  # the whole text while it is shorter than ``keep``
        return buf[sent:] if self.include else buf[: len(buf) - keep], False

    def _first_hit(self, buf: str, old: int) -> tuple[int, str] | None:
        """The earliest stop string in ``buf`` that ends after its first ``old`` characters."""
        hits = [(i, s) for i, s in ((buf.find(s, max(old - len(s) + 1, 0)), s) for s in self.stops) if i >= 0]
        return min(hits, key=lambda hit: hit[0]) if hits else None

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
        return "" if self.stopped or self.include else out
