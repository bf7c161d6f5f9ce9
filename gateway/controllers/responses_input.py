"""``POST /v1/responses/input_tokens`` and ``POST /v1/responses/compact``: what a Responses request's
input comes to, counted (a poll: requests/min alone, not metered, as ``/v1/messages/count_tokens``
is not) or compacted (a call, routed and metered). A deployment that serves the Responses API itself
gets the request as sent; a count for any other is of the chat prompt it would be translated to
(exact for the built-in engine: its chat template); only the former can compact (its compaction item
is the upstream's own, opaque)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import msgspec
from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec

from backends.base import Backend, BackendError, BadRequest, Completed, TokenCounting, Tokenizing
from backends.call import CallContext
from backends.estimate import BOUND_PER_CONVERSATION, bound_chat_prompt, bound_text, estimate_chat_prompt, estimate_text
from gateway.calls import CallDescription
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post
from gateway.controllers.polled import headed, json_answer
from gateway.dialects import Dialect
from gateway.dialects.responses_params import responses_param
from gateway.dialects.responses_request import ResponsesRequest, sent_items
from gateway.errors import ApiError, from_backend_error
from gateway.off_loop import sized
from gateway.pipeline import Pipeline
from gateway.responses_context import chat_request, continued, native, passthrough_body, previous_of, serves_responses
from gateway.routing.router import ModelGroup
from gateway.services import Services


class ResponsesInput(ResponsesRequest):
    """A Responses request whose input may be left out (a conversation continued by id, instructions alone)."""

    input: str | list[dict[str, Any]] = msgspec.field(default_factory=list)


def _not_native(model: str) -> str:
    return (f"compaction is served only by deployments that serve the Responses API natively "
            f"(responses_api: true); the model '{model}' has none")


async def _count(data: ResponsesInput, group: ModelGroup, services: Services, principal: Principal,
                 pipeline: Pipeline) -> dict[str, Any]:
    """The upstream's own count where a deployment serves Responses (of the request as it would send
    it); else that of the translated chat prompt: the engine's chat template (exact), an Anthropic
    upstream's count, or the gateway's estimate."""
    conversation = await continued(pipeline, services.responses, principal, previous_of(data), native(group))
    backends = [d.backend for d in group.deployments]
    if served := next((b for b in backends if serves_responses(b)), None):
        return await served.count_input_tokens(passthrough_body(data, conversation, sent_items(data)))
    chat = chat_request(data, conversation)
    if tokenizer := next((b for b in backends if isinstance(b, Tokenizing)), None):  # a huge prompt in a thread
        tokens = len(await sized(bound_chat_prompt(chat), lambda: tokenizer.tokenize_chat(chat)))
    elif counter := next((b for b in backends if isinstance(b, TokenCounting)), None):
        tokens = await counter.count_chat_tokens(chat)
    else:
        tokens = estimate_chat_prompt(chat)
    return {"object": "response.input_tokens", "input_tokens": tokens}


def _described_compaction(principal: Principal, model: str, body: dict[str, Any]) -> CallDescription:
    """A compaction: a deployment serving Responses gets ``body``; any other (a fallback) refuses it."""

    def invoke(backend: Backend, ctx: CallContext) -> Awaitable[Completed[Any]]:
        if serves_responses(backend):
            return backend.compact(body, ctx)
        raise BadRequest(_not_native(model), param="model")

    return CallDescription(
        principal=principal, endpoint="responses.compact", model=model, stream=False,
        prompt_tokens=estimate_text(msgspec.json.encode(body.get("input")).decode()),
        prompt_bound=BOUND_PER_CONVERSATION + bound_text(msgspec.json.encode(body).decode()),  # every byte sent
        output_limit=None, sequences=1, routing_key=None, invoke=invoke,
        dialect=Dialect(unary=lambda answer, meter: msgspec.json.encode(answer.body)), output_field=None,
    )


class ResponsesInputController(Controller):
    path = "/v1/responses"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @api_post(
        "/input_tokens",
        ResponsesInput,
        summary="Count a Responses request's input tokens (OpenAI Responses API)",
        description="The upstream's own count for a deployment that serves the Responses API (the request as "
        "it would be sent, `previous_response_id`'s kept conversation included); exact for models the built-in "
        "engine serves (the translated prompt's chat template); an estimate otherwise. Counted against "
        "requests/min, not metered.",
        answer=ResponseSpec(None, description='`{"object": "response.input_tokens", "input_tokens": n}`'),
    )
    async def input_tokens(self, request: Request[Any, Any, Any], data: ResponsesInput,
                           services: Services) -> Response[Any]:
        principal, pipeline = principal_of(request), pipeline_of(request)
        group = pipeline.group_for(principal, data.model)
        headers = await pipeline.admit_poll(principal, "responses")
        with headed(headers):
            try:
                return json_answer(await _count(data, group, services, principal, pipeline), headers)
            except BackendError as exc:  # a chat prompt's field named as this request names it
                error = from_backend_error(exc)
                error.param = responses_param(error.param)
                raise error from None
            except ApiError as exc:
                exc.param = responses_param(exc.param)
                raise

    @api_post(
        "/compact",
        ResponsesInput,
        summary="Compact a conversation (OpenAI Responses API)",
        description="Served only by deployments that serve the Responses API natively (`responses_api: true`): "
        "the request as sent (`previous_response_id`'s kept conversation included), metered as a call. Any "
        "other model is a 400.",
        answer=ResponseSpec(None, description="A `response.compaction` object"),
    )
    async def compact(self, request: Request[Any, Any, Any], data: ResponsesInput,
                      services: Services) -> Response[Any]:
        principal, pipeline = principal_of(request), pipeline_of(request)
        group = pipeline.group_for(principal, data.model)
        if not native(group):
            raise ApiError(400, _not_native(data.model), param="model", code="unsupported_value")
        conversation = await continued(pipeline, services.responses, principal, previous_of(data), True)
        body = passthrough_body(data, conversation, sent_items(data))
        return await pipeline.serve(_described_compaction(principal, data.model, body))
