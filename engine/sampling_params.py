"""Per-request sampling parameters (vLLM's names), validated on construction (``InvalidRequest``
naming the field)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from engine.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

    from engine.structured_output import StructuredOutput

MAX_LOGPROBS = 20
# A temperature below this samples greedily (vLLM's _SAMPLING_EPS): dividing the logits by a tiny
# one overflows them to inf, and the draw to NaN.
SAMPLING_EPS = 1e-5
# A top_k above this keeps every token of any vocabulary: it is normalised to 0 (off), as -1 is,
# so no caller's value overflows the sampler's integer tensors.
MAX_TOP_K = 2**31 - 1


@dataclass
class SamplingParams:
    """How to sample one request. ``temperature`` 0 (or below ``SAMPLING_EPS``) means greedy.

    ``max_tokens=None`` means "until the context is full"; ``max_tokens=0`` processes the prompt
    alone and generates nothing (scoring: its ``prompt_logprobs``, a prompt as long as the context
    included). ``logprobs=k`` returns the sampled
    token's logprob plus the ``k`` most likely alternatives at each step; ``prompt_logprobs=k`` the
    same for every prompt token (the first has none), with each token's rank, computed in the prefill
    (``engine.prompt_logprobs``). Both ``k`` are at most ``MAX_LOGPROBS`` (vLLM's default
    ``max_logprobs``); vLLM's ``-1`` (the whole vocabulary per token) is refused. ``seed=-1`` means
    no seed, as in vLLM. ``include_stop_str_in_output``, as vLLM: the text is cut after the stop
    string that ended it rather than before, and a stop token (EOS, ``stop_token_ids``) is decoded
    into it as any token is (nothing for a special token skipped by ``skip_special_tokens``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) that ended it
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)  # OpenAI's: token id -> [-100, 100]
    structured: StructuredOutput | None = None  # a grammar the output must match

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if self.seed == -1:
            self.seed = None
        checks: list[tuple[bool, str, str]] = [
            (self.n >= 1, "n", "n must be >= 1"),
            (self.temperature >= 0.0, "temperature", "temperature must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", "top_p must be in (0, 1]"),
            (self.top_k >= 0 or self.top_k == -1, "top_k", "top_k must be >= 0 (0 or -1 disables it)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "repetition_penalty must be > 0"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "presence_penalty must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
            (self.max_tokens is None or self.max_tokens >= 0, "max_tokens", "max_tokens must be >= 0"),
            (self.min_tokens >= 0, "min_tokens", "min_tokens must be >= 0"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
             "min_tokens must be <= max_tokens"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"logprobs must be in [0, {MAX_LOGPROBS}]"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs",
             f"prompt_logprobs must be in [0, {MAX_LOGPROBS}]"),
            (all(-100.0 <= b <= 100.0 for b in self.logit_bias.values()), "logit_bias",
             "logit_bias values must be in [-100, 100]"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidRequest(message, param=param)
        if self.top_k == -1 or self.top_k > MAX_TOP_K:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @cached_property
    def bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``logit_bias`` as the sampler applies it at every step, built once: the ids biased, their
        biases, and the ids banned (-100). The input processor has checked every id is in the vocabulary."""
        import torch

        kept = [(t, b) for t, b in self.logit_bias.items() if b > -100.0]
        return (torch.tensor([t for t, _ in kept], dtype=torch.long), torch.tensor([b for _, b in kept]),
                torch.tensor([t for t, b in self.logit_bias.items() if b <= -100.0], dtype=torch.long))

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
