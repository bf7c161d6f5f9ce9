"""OpenAI sampling fields -> the worker's batch-wide ``GenerateKey`` and per-row ``RowParams``."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from backends.base import BadRequest
from backends.local.wire import bias_token, limit_field, refuse_unknown_fields
from backends.openai_wire import SamplingFields
from backends.transformers_generate.jobs import GenerateKey, RowParams


def opt(value: Any, default: Any) -> Any:
    """``value`` unless the client left it out (UNSET) or sent null."""
    return default if value is None or value is UNSET else value


def refuse_unsupported(request: SamplingFields) -> None:
    """A field plain generate does not support is a 400 naming it, never a silent drop. vLLM's chat
    fields are the engine's (``backends.local.wire``: the prompt's options and ``echo``), and so is a
    text completion's ``response_format`` (``backends.local.structured``)."""
    refuse_unknown_fields(request, "this deployment")  # at any depth (``stream_options.bogus``)
    for name in ("stop_token_ids", "prompt_logprobs", "chat_template_kwargs"):
        if opt(getattr(request, name, None), None) not in (None, False, [], {}):
            raise BadRequest(f"'{name}' is not supported by this deployment", param=name)
    if opt(request.skip_special_tokens, True) is False:
        raise BadRequest("'skip_special_tokens' is not supported by this deployment", param="skip_special_tokens")


def generate_key(request: SamplingFields) -> GenerateKey:
    """Greedy requests share one key whatever their sampling knobs; seeded sampling runs alone
    (``seed: -1`` is vLLM's "no seed")."""
    refuse_unsupported(request)
    repetition = opt(request.repetition_penalty, 1.0)
    temperature = opt(request.temperature, 1.0)
    if temperature == 0.0:
        return GenerateKey(repetition_penalty=repetition)
    top_k = opt(request.top_k, 0)
    seed = opt(request.seed, None)
    return GenerateKey(True, temperature, opt(request.top_p, 1.0), max(top_k, 0), opt(request.min_p, 0.0),
                       repetition, None if seed == -1 else seed)


def logit_bias(request: SamplingFields, vocab: int) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in (opt(request.logit_bias, {}) or {}).items():
        token = bias_token(key)
        if token is None or not 0 <= token < vocab or not -100 <= value <= 100:
            raise BadRequest(f"logit_bias: {key!r} must be a token id below {vocab} with a bias in [-100, 100]",
                             param="logit_bias")
        bias[token] = value
    return bias


def row_params(request: SamplingFields, max_new_tokens: int, vocab: int, logprobs: int | None = None) -> RowParams:
    params = RowParams(
        max_new_tokens=max_new_tokens,
        min_tokens=opt(request.min_tokens, 0),
        ignore_eos=bool(request.ignore_eos),
        stop=request.stop_list(),
        include_stop_str_in_output=bool(opt(request.include_stop_str_in_output, False)),
        presence_penalty=opt(request.presence_penalty, 0.0),
        frequency_penalty=opt(request.frequency_penalty, 0.0),
        logit_bias=logit_bias(request, vocab),
        logprobs=logprobs,
    )
    if params.min_tokens > params.max_new_tokens:
        raise BadRequest(f"min_tokens must be <= {limit_field(request)}", param="min_tokens")
    return params
