"""What the generation thread works on: jobs of rows, their parameters, and the events they emit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    include_stop_str_in_output: bool = False  # vLLM's: keep the stop string (or EOS's text) that ended it
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
    matchers: list[Any] | None = None  # one grammar matcher (llguidance.LLMatcher) per row, when constrained
    aborted: bool = False

    @property
    def num_rows(self) -> int:
        return len(self.prompts) * self.n

    def finish_all(self, reason: str) -> None:
        for i in range(self.num_rows):
            self.emit(Event(index=i, finish=reason))

    def fail(self, exc: BaseException) -> None:
        self.emit(Event(error=exc))
