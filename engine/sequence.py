"""A sequence: one generated continuation of one request (a request with n > 1 has n)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # the request failed mid-run (``RequestOutput.error`` says why)


@dataclass
class TokenLogprob:
    """The sampled token's logprob and the top alternatives (token id -> logprob). ``rank`` is the
    token's place in the vocabulary by logprob (1: the most likely; ties count against it, as vLLM
    counts them); prompt logprobs carry it (vLLM's ``rank``), sampled tokens leave it None."""

    token_id: int
    logprob: float
    top: dict[int, float]
    rank: int | None = None


_seq_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """Token ids, progress and KV blocks of one continuation.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; the scheduler moves it
    forward, preemption resets it to zero (recompute).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None  # when it first left the waiting queue (monotonic)
    first_token_time: float | None = None
    last_token_time: float | None = None
    generator: torch.Generator | None = None
    max_len: int = 0  # prompt + max output tokens, capped by max_model_len (set on admission)
    cache_salt: int = 0  # mixed into the root block hash; isolates siblings when caching is off
    tenant: str = ""  # who asked (the gateway's tenant id); "" when unknown
    weight: float = 1.0  # the tenant's fair-share weight (engine.fair_queue)
    # Logprobs of the prompt tokens computed so far (engine.prompt_logprobs; the first token has
    # none); None when not asked for. Only a request's first sequence computes them.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    pooling: PoolingParams | None = None  # an embedding request (engine.pooling): pool, never generate
    pool_sum: torch.Tensor | None = None  # mean pooling's running sum of hidden states
    embedding: list[float] | None = None  # the pooled result, once the prompt is computed
    # The grammar matcher (llguidance.LLMatcher) of a structured-output request: it has consumed
    # exactly output_token_ids, so preemption by recompute (which keeps them) leaves it valid.
    matcher: Any = None

    def __post_init__(self) -> None:
        self.token_ids: list[int] = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def computes_whole_prompt(self) -> bool:
        """Every prompt position must run through the model (no prefix-cache hits): the prompt's
        logprobs are wanted, or its hidden states are mean-pooled."""
        return self.prompt_logprobs is not None or (self.pooling is not None and self.pooling.pooling == "mean")

    @property
    def is_prefilling(self) -> bool:
        """More than one token still to compute (prompt, or recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def append_token(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
        now = time.monotonic()
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
