"""The engine's front door: a request is validated once, into an ``EngineRequest`` the core trusts.

As vLLM's input processor: the prompt is tokenized (when given as text), its token ids and every
other token id the caller gave (``stop_token_ids``, ``logit_bias``) checked against the vocabulary,
the sampling parameters taken as validated (``SamplingParams`` checks itself on construction),
and the sequence's maximum length fixed against the model's context and the whole KV cache.
``LLMEngine.add_processed`` and the scheduler then take it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequest, RequestRejected
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputManager


@dataclass(frozen=True)
class EngineRequest:
    """A validated request: token ids, parameters, and the length its sequences may reach."""

    request_id: str
    prompt_ids: list[int]
    prompt_text: str | None  # the text it was tokenized from (None when given as ids)
    params: SamplingParams
    max_len: int  # prompt + max output tokens, capped by the context
    priority: int = 0
    tenant: str = ""  # who asked (the gateway's tenant id); "" when unknown
    weight: float = 1.0  # the tenant's fair-share weight
    pooling: PoolingParams | None = None  # an embedding request: pool the prompt, generate nothing


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit: the model's context and the KV cache (in blocks of ``block_size``)."""

    max_model_len: int
    num_blocks: int
    block_size: int
    vocab_size: int | None = None

    def max_len(self, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """The sequence's maximum length, or RequestRejected saying why it can never run."""
        if num_prompt_tokens == 0:
            raise RequestRejected("the prompt must contain at least one token")
        if max_tokens == 0:  # pooling or scoring: the prompt alone
            if num_prompt_tokens > self.max_model_len:
                raise RequestRejected(f"the input has {num_prompt_tokens} tokens, but this model's context is "
                                      f"{self.max_model_len} tokens")
            return num_prompt_tokens
        if num_prompt_tokens >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {num_prompt_tokens} tokens, but this model's context is "
                f"{self.max_model_len} tokens and at least one must be left to generate"
            )
        max_len = self.max_model_len if max_tokens is None else num_prompt_tokens + max_tokens
        if max_len > self.max_model_len:
            raise RequestRejected(
                f"the prompt ({num_prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"this model's context of {self.max_model_len} tokens; lower max_tokens", param="max_tokens"
            )
        if -(-max_len // self.block_size) > self.num_blocks:
            raise RequestRejected(
                f"the request needs up to {max_len} tokens of KV cache, more than the whole "
                f"cache holds ({self.num_blocks * self.block_size} tokens); lower max_tokens or shorten the prompt",
                param="max_tokens" if max_tokens is not None else None,
            )
        return max_len


class InputProcessor:
    def __init__(self, limits: RequestLimits, tokenizer: Any = None, eos_token_ids: Iterable[int] = ()) -> None:
        self.limits = limits
        self.tokenizer = tokenizer  # engine.tokenizer.Tokenizer, or None: prompts come as token ids
        self.eos_token_ids = set(eos_token_ids)  # the engine's (the model config's too): a grammar may end on any
        self._structured: StructuredOutputManager | None = None

    def structured(self) -> StructuredOutputManager:
        """The grammar compiler and cache (made on first use: it indexes the vocabulary)."""
        if self._structured is None:
            if self.tokenizer is None or not (Path(self.tokenizer.path) / "tokenizer.json").is_file():
                raise InvalidRequest("structured output needs the model's tokenizer.json", param="response_format")
            vocab = max(self.limits.vocab_size or 0, self.tokenizer.vocab_size)
            eos = sorted(self.eos_token_ids | set(self.tokenizer.eos_token_ids))
            self._structured = StructuredOutputManager(self.tokenizer.path, vocab, eos)
        return self._structured

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.tokenizer is None:
            raise InvalidRequest("this model folder has no tokenizer; pass token ids", param="prompt")
        return self.tokenizer.encode(prompt)

    def process(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                priority: int = 0, tenant: str = "", weight: float = 1.0,
                pooling: PoolingParams | None = None) -> EngineRequest:
        """Validate a request once; raise InvalidRequest (RequestRejected when it can never fit).
        With ``pooling`` it is an embedding request (``params`` must then ask for one sequence)."""
        if not weight > 0:
            raise InvalidRequest("the tenant weight must be positive", param="weight")
        params = params or SamplingParams()
        if pooling is not None and params.n != 1:
            raise InvalidRequest("an embedding request has one sequence", param="n")
        prompt_ids = self.tokenize(prompt)
        self._check_token_ids(prompt_ids, params)
        if params.structured is not None:
            if pooling is not None:
                raise InvalidRequest("an embedding request has no structured output", param=params.structured.param)
            self.structured().compile(params.structured)  # compile errors -> InvalidRequest naming the field
        max_len = self.limits.max_len(len(prompt_ids), 0 if pooling is not None else params.max_tokens)
        if params.min_tokens > max_len - len(prompt_ids):  # no max_tokens: the context's end is the limit
            raise InvalidRequest(f"min_tokens ({params.min_tokens}) is more than the context leaves for the "
                                 f"output ({max_len - len(prompt_ids)} tokens)", param="min_tokens")
        text = prompt if isinstance(prompt, str) else None
        return EngineRequest(request_id, prompt_ids, text, params, max_len, priority, tenant, float(weight), pooling)

    def _check_token_ids(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Every token id the caller gave must index the vocabulary: they reach the sampler's
        tensors (an id off it would fail the whole batch's step, or wrap to another token)."""
        vocab = self.limits.vocab_size
        given: list[tuple[str, str, list[int]]] = [
            ("prompt", "prompt token ids", prompt_ids),
            ("stop_token_ids", "stop_token_ids", list(params.stop_token_ids)),
            ("logit_bias", "logit_bias token ids", list(params.logit_bias)),
        ]
        for param, what, ids in given:
            if any(not isinstance(t, int) or t < 0 or (vocab is not None and t >= vocab) for t in ids):
                where = f"[0, {vocab})" if vocab is not None else "non-negative integers"
                raise InvalidRequest(f"{what} must be in {where}", param=param)
