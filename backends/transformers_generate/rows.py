"""Rows of a ``generate`` batch: per-row text, stops and limits, and the hooks ``generate`` calls.

``Tap`` is a ``StoppingCriteria``: after each step it feeds every unfinished row its new token
(advancing its grammar matcher, if any) and reports each row as done on its own. ``RowLogits``
applies per-row penalties inside the shared batch. The model's own EOS handling is off; EOS is a
per-row decision (``ignore_eos``, ``min_tokens``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria

from backends.transformers_generate.jobs import Event, Job
from engine.detok import IncrementalDetokenizer, StopMatcher
from engine.sequence import TokenLogprob


class Row:
    """A choice being generated: detokeniser, stop matcher and counters."""

    def __init__(self, job: Job, index: int, prompt: list[int], tokenizer: Any, eos_ids: set[int]) -> None:
        self.job, self.index, self.prompt = job, index, prompt
        self.eos_ids = eos_ids
        self.detok = IncrementalDetokenizer(tokenizer, prompt)
        self.stops = StopMatcher(job.params.stop, job.params.include_stop_str_in_output)
        self.matcher = job.matchers[index] if job.matchers is not None else None
        self.output: list[int] = []
        self.finished = False

    @property
    def count(self) -> int:
        return len(self.output)

    def end(self, reason: str) -> None:
        """Finish the row; unless aborted, release held-back text (an incomplete character at the
        very end as U+FFFD, as the engine ends a sequence: ``IncrementalDetokenizer.flush``)."""
        self.finished = True
        if reason != "abort" and not self.stops.stopped:
            text, stopped = self.stops.feed(self.detok.flush())
            if not stopped:
                text += self.stops.flush()
            if text:
                self.job.emit(Event(index=self.index, text=text))
        self.job.emit(Event(index=self.index, finish=reason))

    def push(self, token: int, logprobs: torch.Tensor | None) -> None:
        """One new token; ``logprobs`` is the model's log-distribution it was drawn from, if wanted."""
        if self.job.aborted:
            self.end("abort")
            return
        p = self.job.params
        self.output.append(token)
        lp = None
        if p.logprobs is not None and logprobs is not None:
            top = logprobs.topk(p.logprobs) if p.logprobs else None
            alternatives = dict(zip(top.indices.tolist(), top.values.tolist())) if top is not None else {}
            lp = TokenLogprob(token, float(logprobs[token]), alternatives)
        if self.count >= p.min_tokens and not p.ignore_eos and token in self.eos_ids:
            # As vLLM: EOS is decoded into the text only with include_stop_str_in_output.
            text = self.stops.feed(self.detok.push(token), match=False)[0] if p.include_stop_str_in_output else ""
            self.job.emit(Event(index=self.index, text=text, token=True, logprob=lp))
            self.end("stop")
            return
        if self.matcher is not None:
            self.matcher.consume_token(token)
        text, stopped = self.stops.feed(self.detok.push(token), match=self.count >= p.min_tokens)
        self.job.emit(Event(index=self.index, text=text, token=True, logprob=lp))
        # A finished grammar admits nothing more (EOS at most): the row ends, also while EOS is banned.
        if stopped or (self.matcher is not None and self.matcher.is_stopped()):
            self.end("stop")
        elif self.count >= p.max_new_tokens:
            self.end("length")


class Tap(StoppingCriteria):
    """Called by ``generate`` after each step with all ids so far: feeds rows, says which are done.

    With ``capture_logits`` a forward hook on the model keeps the last position's raw logits of
    each step, so rows that asked for logprobs get them from the unprocessed distribution.
    """

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.logits: torch.Tensor | None = None

    def capture_logits(self, module: Any, args: Any, output: Any) -> None:
        self.logits = output.logits[:, -1, :]

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        logprobs = torch.log_softmax(self.logits.float(), dim=-1) if self.logits is not None else None
        for b, (row, token) in enumerate(zip(self.rows, input_ids[:, -1].tolist(), strict=True)):
            if not row.finished:
                row.push(token, logprobs[b] if logprobs is not None else None)
        return torch.tensor([r.finished for r in self.rows], device=input_ids.device)  # type: ignore[return-value]


class RowLogits(LogitsProcessor):
    """OpenAI's presence/frequency penalties (over generated tokens), logit_bias and min_tokens, per row."""

    def __init__(self, rows: list[Row], prompt_width: int) -> None:
        self.rows, self.width = rows, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.width :]
        for b, row in enumerate(self.rows):
            p = row.job.params
            if p.presence_penalty or p.frequency_penalty:
                counts = torch.bincount(generated[b], minlength=scores.shape[1])[: scores.shape[1]].to(scores.dtype)
                scores[b] -= counts * p.frequency_penalty + (counts > 0).to(scores.dtype) * p.presence_penalty
            for token, bias in p.logit_bias.items():
                scores[b, token] += bias
            if generated.shape[1] < p.min_tokens and not p.ignore_eos:
                scores[b, sorted(row.eos_ids)] = float("-inf")
        return scores
