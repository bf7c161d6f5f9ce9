"""The generation thread of the plain transformers path: a bounded queue, batching, ``generate``.

One daemon thread takes the oldest queued job plus every queued job whose batch-wide parameters
(``GenerateKey``) are equal, up to ``max_batch_rows`` rows and within the context (every row of a
batch runs for its longest prompt plus its largest ``max_new_tokens`` positions), left-pads their prompts and runs one
``model.generate``. A ``StoppingCriteria`` sees every new token of every row: it detokenises,
matches stop strings, applies per-row limits and aborts, and reports each row as done on its own,
so rows with different lengths, stop strings or penalties share a batch. The model's own EOS
handling is switched off; EOS is a per-row decision here (``ignore_eos``, ``min_tokens``). Rows
with a grammar (structured output, tool calls) are masked by ``GrammarLogits`` after the penalties.
Events go back to the job's ``emit`` callback (thread-safe on the caller's side).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from backends.base import Unavailable
from backends.transformers_generate.grammar import GrammarLogits
from backends.transformers_generate.jobs import Job
from backends.transformers_generate.rows import Row, RowLogits, Tap


class GenerateWorker:
    """Owns the model while generating; ``submit`` jobs, ``cancel`` them, ``close`` at the end."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: set[int], pad_id: int, *,
                 max_batch_rows: int = 8, max_queue: int = 64, bitmask_words: int = 0,
                 max_len: int | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_len = max_len  # positions a batch may span (the model's context); None: unbounded
        self.bitmask_words = bitmask_words  # 32-token words per grammar bitmask row
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
        """The oldest job plus queued jobs with the same key, within ``max_batch_rows`` and the
        context (lock held): a short prompt's long output beside a long prompt's short one would
        run the long prompt's row past the model's positions, failing both."""
        first = self._pending.popleft()
        batch, rows = [first], first.num_rows
        width, new = _width(first), first.params.max_new_tokens
        if first.key.seed is not None:
            return batch
        for job in list(self._pending):
            span = max(width, _width(job)) + max(new, job.params.max_new_tokens)
            fits = self.max_len is None or span <= self.max_len
            if job.key == first.key and rows + job.num_rows <= self.max_batch_rows and fits:
                self._pending.remove(job)
                batch.append(job)
                rows += job.num_rows
                width, new = max(width, _width(job)), max(new, job.params.max_new_tokens)
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
            Row(job, p * job.n + j, prompt, self.tokenizer, self.eos_ids)
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
            processors.append(RowLogits(rows, width))
        if any(job.matchers is not None for job in batch):
            processors.append(GrammarLogits(rows, self.bitmask_words))
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(rows))
        tap = Tap(rows)
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


def _width(job: Job) -> int:
    """The job's longest prompt: the width its rows are left-padded to."""
    return max(len(p) for p in job.prompts)
