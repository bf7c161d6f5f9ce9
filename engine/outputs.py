"""Per-sequence text: incremental detokenisation plus stop-string matching, with deltas."""

from __future__ import annotations

from engine.sampling_params import SamplingParams


class TextState:
    """Turns a sequence's tokens into text. ``push`` returns True when a stop string matched
    (the stop string itself never reaches ``text``). Without a tokenizer, text stays empty."""

    def __init__(self, tokenizer: object | None, params: SamplingParams, prompt_ids: list[int]) -> None:
        self.text = ""
        self.stop_reason: str | int | None = None
        self._delta: list[str] = []
        self._detok = None
        self._matcher = None
        if tokenizer is not None:
            from engine.detok import IncrementalDetokenizer, StopMatcher

            self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens)
            if params.stop:
                self._matcher = StopMatcher(list(params.stop))

    def _emit(self, piece: str) -> None:
        if piece:
            self.text += piece
            self._delta.append(piece)

    def push(self, token_id: int) -> bool:
        if self._detok is None:
            return False
        new = self._detok.push(token_id)
        if self._matcher is None:
            self._emit(new)
            return False
        emit, stopped = self._matcher.feed(new)
        self._emit(emit)
        return stopped

    def stop(self, reason: str | int | None) -> None:
        """Finished on a stop token / EOS (not part of the text)."""
        self.stop_reason = reason
        self.finish()

    def finish(self) -> None:
        """Release text held back as a possible stop-string prefix."""
        if self._matcher is not None:
            self._emit(self._matcher.flush())

    def take_delta(self) -> str:
        out = "".join(self._delta)
        self._delta.clear()
        return out
