"""The generation thread of the plain transformers path: a bounded queue, batching, ``generate``.

One daemon thread takes the oldest queued job plus every queued job whose batch-wide parameters
(``GenerateKey``) are equal, up to ``max_batch_rows`` rows, left-pads their prompts and runs one
``model.generate``. A ``StoppingCriteria`` sees every new token of every row: it detokenises,
matches stop strings, applies per-row limits and aborts, and reports each row as done on its own,
so rows with different lengths, stop strings or penalties share a batch. The model's own EOS
handling is switched off; EOS is a per-row decision here (``ignore_eos``, ``min_tokens``).
Events go back to the job's ``emit`` callback (thread-safe on the caller's side).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from backends.base import Unavailable
from engine.detok import IncrementalDetokenizer, StopMatcher
from engine.sequence import TokenLogprob


@dataclass(frozen=True)
class GenerateKey:
    """What ``generate`` applies to a whole batch; jobs share a batch only when keys are equal."""

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # a seeded sampling job runs alone, after seeding the generator


@dataclass
class RowParams:
    """Per-row parameters, applied inside a shared batch."""

    max_new_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely

    @property
    def needs_processor(self) -> bool:
        return bool(self.min_tokens or self.presence_penalty or self.frequency_penalty or self.logit_bias)


@dataclass
class Event:
    """One thing that happened to choice ``index``: new text/token, its end, or a failure."""

    index: int = 0
    text: str = ""
    token: bool = False
    finish: str | None = None  # "stop", "length", "abort"
    error: BaseException | None = None
    logprob: TokenLogprob | None = None  # with ``token`` when the job asked for logprobs


@dataclass(eq=False)
class Job:
    """One request: ``prompts`` x ``n`` rows; choice index = prompt index * n + j."""

    prompts: list[list[int]]
    n: int
    key: GenerateKey
    params: RowParams
    emit: Callable[[Event], None]
    aborted: bool = False

    @property
    def num_rows(self) -> int:
        return len(self.prompts) * self.n

    def finish_all(self, reason: str) -> None:
        for i in range(self.num_rows):
            self.emit(Event(index=i, finish=reason))

    def fail(self, exc: BaseException) -> None:
        self.emit(Event(error=exc))


class _Row:
    """A choice being generated: detokeniser, stop matcher and counters."""

    def __init__(self, job: Job, index: int, prompt: list[int], tokenizer: Any, eos_ids: set[int]) -> None:
        self.job, self.index, self.prompt = job, index, prompt
        self.eos_ids, self.tokenizer = eos_ids, tokenizer
        self.detok = IncrementalDetokenizer(tokenizer, prompt)
        self.stops = StopMatcher(job.params.stop)
        self.output: list[int] = []
        self.finished = False

    @property
    def count(self) -> int:
        return len(self.output)

    def end(self, reason: str) -> None:
        """Finish the row; unless aborted, release held-back text (an incomplete character at the
        very end is emitted as the tokenizer decodes it, so the text equals decode(output))."""
        self.finished = True
        if reason != "abort" and not self.stops.stopped:
            full = self.tokenizer.decode(self.output, skip_special_tokens=True)
            tail = full[len(self.detok.text):] if full.startswith(self.detok.text) else ""
            text, stopped = self.stops.feed(tail)
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
            self.job.emit(Event(index=self.index, token=True, logprob=lp))
            self.end("stop")
            return
        text, stopped = self.stops.feed(self.detok.push(token))
        self.job.emit(Event(index=self.index, text=text, token=True, logprob=lp))
        if stopped:
            self.end("stop")
        elif self.count >= p.max_new_tokens:
            self.end("length")


class _Tap(StoppingCriteria):
    """Called by ``generate`` after each step with all ids so far: feeds rows, says which are done.

    With ``capture_logits`` a forward hook on the model keeps the last position's raw logits of
    each step, so rows that asked for logprobs get them from the unprocessed distribution.
    """

    def __init__(self, rows: list[_Row]) -> None:
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


class _RowLogits(LogitsProcessor):
    """OpenAI's presence/frequency penalties (over generated tokens), logit_bias and min_tokens, per row."""

    def __init__(self, rows: list[_Row], prompt_width: int) -> None:
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


class GenerateWorker:
    """Owns the model while generating; ``submit`` jobs, ``cancel`` them, ``close`` at the end."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: set[int], pad_id: int, *,
                 max_batch_rows: int = 8, max_queue: int = 64) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.max_batch_rows, self.max_queue = max_batch_rows, max_queue
        self.device = next(model.parameters()).device
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []
        self._closed = False
        self.batches_run = 0
        self.largest_batch = 0  # rows in the largest batch so far (observability and tests)
        self._thread = threading.Thread(target=self._loop, name="hf-generate", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise Unavailable("the transformers backend is shutting down")
            if len(self._pending) >= self.max_queue:
                raise Unavailable(f"the transformers backend queue is full ({self.max_queue} requests waiting)")
            self._pending.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Abort a job: dropped now if still queued, else stopped at the next generation step."""
        job.aborted = True
        with self._cond:
            if job not in self._pending:
                return
            self._pending.remove(job)
        job.finish_all("abort")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._pending = list(self._pending), deque()
            for job in self._running:
                job.aborted = True
            self._cond.notify()
        for job in pending:
            job.aborted = True
            job.finish_all("abort")
        self._thread.join()

    # -- the thread ----------------------------------------------------------------------------

    def _take_batch(self) -> list[Job]:
        """The oldest job plus queued jobs with the same key, within ``max_batch_rows`` (lock held)."""
        first = self._pending.popleft()
        batch, rows = [first], first.num_rows
        if first.key.seed is not None:
            return batch
        for job in list(self._pending):
            if job.key == first.key and rows + job.num_rows <= self.max_batch_rows:
                self._pending.remove(job)
                batch.append(job)
                rows += job.num_rows
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = self._take_batch()
                self._running = batch
            try:
                self._generate(batch)
            except Exception as exc:  # reported to every caller of the batch, the thread lives on
                for job in batch:
                    job.fail(Unavailable(f"transformers generate failed: {type(exc).__name__}: {exc}"))
            finally:
                with self._cond:
                    self._running = []

    @torch.inference_mode()
    def _generate(self, batch: list[Job]) -> None:
        rows = [
            _Row(job, p * job.n + j, prompt, self.tokenizer, self.eos_ids)
            for job in batch
            for p, prompt in enumerate(job.prompts)
            for j in range(job.n)
        ]
        width = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, width - len(row.prompt) :] = torch.tensor(row.prompt)
            mask[b, width - len(row.prompt) :] = 1
        key = batch[0].key
        sampling = {}
        if key.do_sample:
            sampling = dict(temperature=key.temperature, top_p=key.top_p, top_k=key.top_k, min_p=key.min_p or None)
            if key.seed is not None:
                torch.manual_seed(key.seed)
        config = GenerationConfig(
            max_new_tokens=max(job.params.max_new_tokens for job in batch), do_sample=key.do_sample,
            repetition_penalty=key.repetition_penalty, pad_token_id=self.pad_id, **sampling,
        )
        processors = LogitsProcessorList()
        if any(job.params.needs_processor for job in batch):
            processors.append(_RowLogits(rows, width))
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(rows))
        tap = _Tap(rows)
        hook = None
        if any(job.params.logprobs is not None for job in batch):
            hook = self.model.register_forward_hook(tap.capture_logits)
        try:
            self.model.generate(
                ids.to(self.device), attention_mask=mask.to(self.device), generation_config=config,
                logits_processor=processors, stopping_criteria=StoppingCriteriaList([tap]),
            )
        finally:
            if hook is not None:
                hook.remove()
        for row in rows:  # generate ended (all done, or its own max_new_tokens)
            if not row.finished:
                row.end("abort" if row.job.aborted else "length")
