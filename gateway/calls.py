"""One API call, described once where it enters the gateway: ``CallDescription``.

A controller validates its body and builds the description; ``Pipeline.serve`` takes it through
auth's result -> admission -> routing -> the backend -> settlement without asking the body
anything again. A new endpoint is a controller plus a ``describe_*`` function (here when several
endpoints share it, else in the controller), never a copy of the pipeline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from backends.base import Backend, ChunkStream, Completed, Tokenizing
from backends.call import CallContext, RenderedPrompt
from backends.estimate import (
    bound_chat_prompt,
    bound_completion_prompt,
    estimate_chat_prompt,
    estimate_completion_prompt,
)
from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from backends.prompt_count import PromptCounter
from gateway.contracts import Principal
from gateway.dialects import OPENAI, Dialect
from gateway.errors import ApiError
from gateway.routing.cache_aware import chat_prefix, completion_prefix
from gateway.usage.pricing import NO_TOOLS, HostedTools

# A text completion without max_tokens generates 16 tokens: OpenAI's documented default, and vLLM's.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# The field that caps the output, by endpoint, where describe_chat serves a translated one.
OUTPUT_FIELDS = {"messages": "max_tokens", "responses": "max_output_tokens"}
Invoke = Callable[[Backend, CallContext], Awaitable[Completed[Any] | ChunkStream[Any]]]
# The prompt's tokens with a backend's own tokenizer (exact), or with a deployment's configured one.
CountPrompt = Callable[[Tokenizing | PromptCounter], int]


@dataclass(frozen=True)
class CallDescription:
    """What the pipeline needs to know about one call, and how to make it on a chosen backend."""

    principal: Principal
    endpoint: str  # "chat.completions" | "completions" | "messages": usage rows, metrics, span names
    model: str  # as the client named it
    stream: bool
    prompt_tokens: int  # estimated: compared with deployments' context windows
    prompt_bound: int  # an upper bound on the prompt's tokens (bytes): reserved where no tokenizer counts it
    output_limit: int | None  # the client's cap per sequence (None: it set none)
    sequences: int  # sequences generated (choices x prompts): admission reserves output for each
    routing_key: str | None  # the prompt's opening, for strategy cache_aware (None: no text)
    invoke: Invoke  # the backend method with the body bound: ``invoke(backend, ctx)``
    dialect: Dialect = OPENAI
    count_prompt: CountPrompt | None = None  # None: only the bound is known
    api_default_limit: int | None = None  # the API's own cap per sequence where the client sets none
    output_field: str | None = "max_tokens"  # the field the output reservation came from (None: no output)
    # what count_prompt rendered with a backend's own tokenizer: handed to that backend (CallContext.rendered)
    rendered: list[RenderedPrompt] = field(default_factory=list)
    # the tools it enables that the provider runs: admission reserves the fees of those priced per call
    hosted_tools: HostedTools = NO_TOOLS


def describe_chat(principal: Principal, body: ChatCompletionRequest, *, endpoint: str = "chat.completions",
                  dialect: Dialect = OPENAI) -> CallDescription:
    """A chat completion (also what ``/v1/messages`` becomes once translated)."""
    if body.stream_options not in (None, msgspec.UNSET) and not body.is_stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    if isinstance(body.top_logprobs, int) and not body.logprobs:
        raise ApiError(400, "'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    if body.tool_choice not in (None, msgspec.UNSET) and not body.tools:
        raise ApiError(400, "'tool_choice' is only allowed when 'tools' are specified.", param="tool_choice")
    stream = body.is_stream
    output_field = OUTPUT_FIELDS.get(endpoint) or (
        "max_completion_tokens" if isinstance(body.max_completion_tokens, int) else "max_tokens")

    def invoke(backend: Backend, ctx: CallContext) -> Awaitable[Completed[Any] | ChunkStream[Any]]:
        return backend.chat_stream(body, ctx) if stream else backend.chat(body, ctx)

    rendered: list[RenderedPrompt] = []
    return CallDescription(
        principal=principal, endpoint=endpoint, model=body.model, stream=stream,
        prompt_tokens=estimate_chat_prompt(body), prompt_bound=bound_chat_prompt(body),
        output_limit=body.output_limit(), sequences=body.sequences(), routing_key=chat_prefix(body), invoke=invoke,
        dialect=dialect, count_prompt=lambda tokenizer: _count_chat(tokenizer, body, rendered),
        output_field=output_field, rendered=rendered,
    )


def _count_chat(tokenizer: Tokenizing | PromptCounter, body: ChatCompletionRequest,
                rendered: list[RenderedPrompt]) -> int:
    """The prompt's tokens; a backend's own rendering is kept in ``rendered``, for the backend to reuse."""
    if isinstance(tokenizer, PromptCounter):
        return tokenizer.count_chat(body)
    ids = tokenizer.tokenize_chat(body)
    rendered.append(RenderedPrompt(tokenizer, body, ids))
    return len(ids)


def describe_completion(principal: Principal, body: CompletionRequest) -> CallDescription:
    """A legacy text completion: one or several prompts, ``n`` (or ``best_of``) sequences each."""
    try:
        body.prompts()
    except ValueError as exc:
        raise ApiError(400, str(exc), param="prompt") from None
    if body.stream_options not in (None, msgspec.UNSET) and not body.is_stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    stream = body.is_stream

    def invoke(backend: Backend, ctx: CallContext) -> Awaitable[Completed[Any] | ChunkStream[Any]]:
        return backend.complete_stream(body, ctx) if stream else backend.complete(body, ctx)

    return CallDescription(
        principal=principal, endpoint="completions", model=body.model, stream=stream,
        prompt_tokens=estimate_completion_prompt(body), prompt_bound=bound_completion_prompt(body),
        output_limit=body.output_limit(), sequences=body.sequences(), routing_key=completion_prefix(body),
        invoke=invoke, api_default_limit=COMPLETION_DEFAULT_MAX_TOKENS,
    )
