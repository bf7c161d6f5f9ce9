"""Structured output and tool-call grammars on the plain generate path, with the engine's code.

``Grammars`` compiles (and caches) a request's constraint with ``engine.structured_output`` for
the model's tokenizer and makes one matcher per row; ``GrammarLogits`` is the ``LogitsProcessor``
that fills the batch's token bitmask from the rows' matchers each step and masks the scores, as
the engine's sampler does. Rows advance their matcher on each token (``rows.Row.push``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import LogitsProcessor

from backends.base import BadRequest
from engine.errors import InvalidRequest
from engine.structured_output import StructuredOutput, StructuredOutputManager, apply_bitmask, fill_bitmask

if TYPE_CHECKING:
    from backends.transformers_generate.rows import Row


class Grammars:
    """The grammar compiler for one model's tokenizer (made on first use: it indexes the vocabulary)."""

    def __init__(self, folder: str, vocab_size: int, eos_ids: set[int]) -> None:
        self.folder, self.vocab_size, self.eos_ids = folder, vocab_size, sorted(eos_ids)
        self._manager: StructuredOutputManager | None = None

    def matchers(self, so: StructuredOutput, rows: int) -> list[Any]:
        """``rows`` fresh matchers for ``so``; a 400 naming ``so.param`` when it cannot be compiled."""
        if self._manager is None:
            if not (Path(self.folder) / "tokenizer.json").is_file():
                raise BadRequest("structured output needs the model's tokenizer.json (a fast tokenizer)",
                                 param=so.param)
            self._manager = StructuredOutputManager(self.folder, self.vocab_size, self.eos_ids)
        try:
            return [self._manager.matcher(so) for _ in range(rows)]
        except InvalidRequest as exc:
            raise BadRequest(exc.message, param=exc.param) from None


class GrammarLogits(LogitsProcessor):
    """Masks each constrained, unfinished row's scores to the tokens its grammar allows next."""

    def __init__(self, rows: list[Row], words: int) -> None:
        self.rows, self.words = rows, words

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # A finished row is left free: generate still samples it (then pads), so it must keep a token.
        mask = fill_bitmask([None if r.finished else r.matcher for r in self.rows], self.words)
        return scores if mask is None else apply_bitmask(scores, mask)
