"""``POST /v1/messages``: Anthropic's Messages API, routed like chat completions; errors in
Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``. A deployment that speaks the
Messages API gets the request as the client sent it; any other, its translation to chat."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec

from backends.base import Backend, BackendError, BadRequest, ChunkStream, Completed, TokenCounting, Tokenizing
from backends.call import CallContext
from backends.estimate import bound_chat_prompt, estimate_chat_prompt
from backends.openai_wire import ChatCompletionRequest, extra_params
from gateway.calls import CallDescription, describe_chat
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post
from gateway.controllers.polled import headed, json_answer
from gateway.dialects.anthropic import ANTHROPIC, error_handlers
from gateway.dialects.anthropic_params import in_messages_terms
from gateway.dialects.anthropic_request import (
    CountTokensRequest,
    MessagesRequest,
    as_sent,
    serves_messages,
    to_chat_request,
    translate,
)
from gateway.errors import ApiError, from_backend_error
from gateway.off_loop import sized
from gateway.pipeline import Pipeline
from gateway.request_headers import request_headers
from gateway.routing.router import ModelGroup
from gateway.usage.pricing import HostedTools

# vLLM's chat fields a translated prefill is sent with (``anthropic_request._prefill``)
_PREFILL_FIELDS = ("continue_final_message", "add_generation_prompt")
Invoke = Callable[[Backend, CallContext], Awaitable[Completed[Any] | ChunkStream[Any]]]


def _prefill_refused(data: MessagesRequest, invoke: Invoke) -> Invoke:
    """``invoke``, where a chat upstream that does not know ``_PREFILL_FIELDS`` (OpenAI's own API)
    refuses them: its 400 names the prefill, not a field the client never sent."""
    last = f"messages[{len(data.messages) - 1}]"

    async def call(backend: Backend, ctx: CallContext) -> Completed[Any] | ChunkStream[Any]:
        try:
            return await invoke(backend, ctx)
        except BadRequest as exc:
            if exc.param not in _PREFILL_FIELDS and not any(f in exc.message for f in _PREFILL_FIELDS):
                raise
            raise BadRequest(f"{last}: this model cannot continue a final assistant message (a prefill): its "
                             f"provider refused vLLM's continue_final_message ({exc.message})", param=last) from None

    return call


def _named_as_sent(origins: list[str], invoke: Invoke) -> Invoke:
    """``invoke`` of a translated request, its errors naming the fields as the client sent them."""

    async def call(backend: Backend, ctx: CallContext) -> Completed[Any] | ChunkStream[Any]:
        try:
            return await invoke(backend, ctx)
        except BackendError as exc:
            raise in_messages_terms(exc, origins) from None

    return call


def describe_messages(principal: Principal, data: MessagesRequest, group: ModelGroup,
                      headers: Mapping[str, str]) -> CallDescription:
    """A Messages call. Without a deployment that speaks the Messages API it is a translated chat
    call (what cannot be translated is a 400 at once); with one, that deployment gets the request as
    sent, and any other (a fallback) its translation when it is tried, a 400 naming what cannot be."""
    if not any(serves_messages(d.backend) for d in group.deployments):
        chat, origins = translate(data)
        call = describe_chat(principal, chat, endpoint="messages", dialect=ANTHROPIC)
        named = _named_as_sent(origins, call.invoke)
        prefill = any(f in extra_params(chat) for f in _PREFILL_FIELDS)
        return dataclasses.replace(call, invoke=_prefill_refused(data, named) if prefill else named)
    call = describe_chat(principal, as_sent(data, headers), endpoint="messages", dialect=ANTHROPIC)
    translated: list[tuple[ChatCompletionRequest, list[str]]] = []

    async def invoke(backend: Backend, ctx: CallContext) -> Completed[Any] | ChunkStream[Any]:
        if serves_messages(backend):
            return await call.invoke(backend, ctx)
        if not translated:
            try:
                translated.append(translate(data))
            except ApiError as exc:
                raise BadRequest(exc.message, param=exc.param) from None
        chat, origins = translated[0]
        try:
            return await (backend.chat_stream(chat, ctx) if call.stream else backend.chat(chat, ctx))
        except BackendError as exc:
            raise in_messages_terms(exc, origins) from None

    # its server tools go to a deployment serving Messages: the fees of those priced per call are reserved
    tools = HostedTools.of(data.tools)
    return dataclasses.replace(call, invoke=_prefill_refused(data, invoke), hosted_tools=tools)


class MessagesController(Controller):
    path = "/v1/messages"
    tags = ["Anthropic"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method
    exception_handlers = error_handlers()

    @api_post(
        "/",
        MessagesRequest,
        summary="Create a message (Anthropic Messages API)",
        description="For clients that speak Anthropic's API (`x-api-key` or bearer auth). Served by any "
        "provider behind the model: an Anthropic deployment gets the request as sent (with the client's "
        "`anthropic-version` and `anthropic-beta` headers), any other its translation. Betas, server tools "
        "and Files API `file_id`s go only to a deployment that lists them (`anthropic_betas`, "
        "`server_tools`); else a 400 names them. With `stream: true` the answer is Anthropic's event stream.",
        answer=ResponseSpec(None, description="An Anthropic `message` object (or its event stream)"),
    )
    async def create(self, request: Request[Any, Any, Any], data: MessagesRequest) -> Response[Any]:
        principal, pipeline = principal_of(request), pipeline_of(request)
        group = pipeline.group_for(principal, data.model)
        call = describe_messages(principal, data, group, request_headers(request.scope))
        return await pipeline.serve(call)

    @api_post(
        "/count_tokens",
        CountTokensRequest,
        summary="Count a conversation's input tokens (Anthropic Messages API)",
        description="Exact for models the built-in engine serves (their chat template) and for Anthropic "
        "deployments (the body as sent, counted upstream); an estimate otherwise. Counted against requests/min, "
        "not metered.",
        answer=ResponseSpec(None, description='`{"input_tokens": n}`'),
    )
    async def count_tokens(self, request: Request[Any, Any, Any], data: CountTokensRequest,
                           pipeline: Pipeline) -> Response[Any]:
        principal = principal_of(request)
        group = pipeline.group_for(principal, data.model)
        headers = await pipeline.admit_poll(principal, "messages", ANTHROPIC.ratelimit_headers)
        with headed(headers):
            return json_answer({"input_tokens": await _counted(request, data, group)}, headers)


async def _counted(request: Request[Any, Any, Any], data: CountTokensRequest, group: ModelGroup) -> int:
    """``data``'s input tokens: the engine's chat template's, an Anthropic upstream's count of the body
    as sent, or the estimate of its translation."""
    messages = data.as_messages_request()
    backends = [d.backend for d in group.deployments]
    try:
        if tokenizer := next((b for b in backends if isinstance(b, Tokenizing)), None):
            chat, origins = translate(messages)
            try:  # a huge conversation in a thread
                return len(await sized(bound_chat_prompt(chat), lambda: tokenizer.tokenize_chat(chat)))
            except BackendError as exc:
                raise in_messages_terms(exc, origins) from None
        if counter := next((b for b in backends if isinstance(b, TokenCounting)), None):
            chat = as_sent(messages, request_headers(request.scope)) if serves_messages(counter) \
                else to_chat_request(messages)
            return await counter.count_chat_tokens(chat)
    except BackendError as exc:
        raise from_backend_error(exc) from None
    return estimate_chat_prompt(to_chat_request(messages))
