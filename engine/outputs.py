"""What the engine reports: per-sequence text (incremental detokenisation plus stop strings),
and the request outputs built from a request's sequences, cumulative and as deltas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence, TokenLogprob


class TextState:
    """Turns a sequence's tokens into text. ``push`` returns True when a stop string matched (the
    stop string reaches ``text`` only with ``include_stop_str_in_output``). Without a tokenizer,
    text stays empty."""

    def __init__(self, tokenizer: Any, params: SamplingParams, prompt_ids: list[int]) -> None:
        self.text = ""
        self.stop_reason: str | int | None = None
        self._delta: list[str] = []
        self._detok = None
        self._matcher = None
        self._include = params.include_stop_str_in_output
        if tokenizer is not None:
            from engine.detok import IncrementalDetokenizer, StopMatcher

            self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens)
            if params.stop:
                self._matcher = StopMatcher(list(params.stop), include=self._include)

    def _emit(self, piece: str) -> None:
        if piece:
            self.text += piece
            self._delta.append(piece)

    def push(self, token_id: int, check_stop: bool = True) -> bool:
        """Add a token's text; ``check_stop=False`` (before ``min_tokens``) never stops."""
        if self._detok is None:
            return False
        new = self._detok.push(token_id)
        if self._matcher is None:
            self._emit(new)
            return False
        emit, stopped = self._matcher.feed(new, match=check_stop)
        self._emit(emit)
        if stopped:
            self.stop_reason = self._matcher.matched  # vLLM's stop_reason: the stop string that matched
        return stopped

    def stop(self, reason: str | int | None, token_id: int | None = None) -> None:
        """Finished (on ``token_id``, a stop token / EOS, if given: as vLLM, not part of the text
        unless ``include_stop_str_in_output``, then decoded as any token, never matched as a stop
        string)."""
        self.stop_reason = reason
        if self._include and token_id is not None:
            self.push(token_id, check_stop=False)
        self.finish()

    def finish(self) -> None:
        """Release what is held back: a character begun by the last tokens and never completed (as
        U+FFFD, cut as any text where it completes a stop string), and text held back as a possible
        stop-string prefix."""
        if self._detok is None:
            return
        tail = self._detok.flush()
        if self._matcher is None:
            self._emit(tail)
            return
        self._emit(self._matcher.feed(tail)[0])
        self._emit(self._matcher.flush())

    def take_delta(self) -> str:
        out = "".join(self._delta)
        self._delta.clear()
        return out


@dataclass
class CompletionOutput:
    """One continuation. ``text``/``token_ids``/``logprobs`` are cumulative; the ``delta_``
    fields hold what is new since the previous output of the same request."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    arrival_time: float = 0.0  # time.monotonic() clock
    first_token_time: float | None = None  # of the earliest sequence
    first_scheduled_time: float | None = None  # when the earliest sequence left the waiting queue
    # The prompt tokens' logprobs (the first is None) when ``prompt_logprobs`` was asked for; complete
    # once the prompt has been computed (by the first output that carries generated tokens).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    embedding: list[float] | None = None  # an embedding request's result (engine.pooling)
    # Set when the request failed mid-run (its sequences finish with "error"); ``AsyncEngine``
    # raises it on the request's stream instead of yielding this output.
    error: EngineError | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


@dataclass
class RequestState:
    """The engine's book-keeping for one request (n sequences)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    texts: list[TextState]
    arrival_time: float
    sent_tokens: list[int]  # per sequence: tokens already reported
    stream: bool  # report every step (else only the final output)
    error: EngineError | None = None  # why it failed mid-run

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self) -> RequestOutput:
        """The request's output now; deltas cover what changed since the previous call."""
        outs = []
        for i, (seq, text) in enumerate(zip(self.seqs, self.texts)):
            sent = self.sent_tokens[i]
            want_lp = seq.params.logprobs is not None
            outs.append(
                CompletionOutput(
                    index=seq.index,
                    text=text.text,
                    token_ids=list(seq.output_token_ids),
                    logprobs=list(seq.logprobs) if want_lp else None,
                    finish_reason=seq.finish_reason.value if seq.finish_reason else None,
                    stop_reason=text.stop_reason,
                    delta_text=text.take_delta(),
                    delta_token_ids=seq.output_token_ids[sent:],
                    delta_logprobs=seq.logprobs[sent:] if want_lp else None,
                )
            )
            self.sent_tokens[i] = seq.num_output_tokens
        firsts = [s.first_token_time for s in self.seqs if s.first_token_time is not None]
        scheduled = [s.first_scheduled_time for s in self.seqs if s.first_scheduled_time is not None]
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outs,
            self.finished,
            self.seqs[0].num_cached_tokens,
            self.arrival_time,
            min(firsts) if firsts else None,
            min(scheduled) if scheduled else None,
            list(self.seqs[0].prompt_logprobs) if self.seqs[0].prompt_logprobs is not None else None,
            self.seqs[0].embedding,
            self.error,
        )
