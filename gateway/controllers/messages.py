"""``POST /v1/messages``: Anthropic's Messages API, routed like chat completions; errors in
Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.openapi.datastructures import ResponseSpec

from backends.base import BackendError, TokenCounting, Tokenizing
from backends.estimate import estimate_chat_prompt
from gateway.body import WireBody
from gateway.calls import describe_chat
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import error_responses
from gateway.dialects.anthropic import ANTHROPIC, CountTokensRequest, MessagesRequest, error_handlers, to_chat_request
from gateway.errors import from_backend_error
from gateway.pipeline import Pipeline


class MessagesController(Controller):
    path = "/v1/messages"
    tags = ["Anthropic"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method
    exception_handlers = error_handlers()

    @post(
        "/",
        status_code=200,
        dto=WireBody[MessagesRequest],
        return_dto=None,
        summary="Create a message (Anthropic Messages API)",
        description="For clients that speak Anthropic's API (`x-api-key` or bearer auth). Served by any "
        "provider behind the model. With `stream: true` the answer is Anthropic's event stream.",
        responses={200: ResponseSpec(None, description="An Anthropic `message` object (or its event stream)"),
                   **error_responses()},
    )
    async def create(self, request: Request[Any, Any, Any], data: MessagesRequest) -> Response[Any]:
        call = describe_chat(principal_of(request), to_chat_request(data), endpoint="messages", dialect=ANTHROPIC)
        return await pipeline_of(request).serve(call)

    @post(
        "/count_tokens",
        status_code=200,
        dto=WireBody[CountTokensRequest],
        return_dto=None,
        summary="Count a conversation's input tokens (Anthropic Messages API)",
        description="Exact for models the built-in engine serves (their chat template) and for Anthropic "
        "deployments (asked upstream); an estimate otherwise. Not metered.",
        responses={200: ResponseSpec(None, description='`{"input_tokens": n}`'), **error_responses()},
    )
    async def count_tokens(self, request: Request[Any, Any, Any], data: CountTokensRequest,
                           pipeline: Pipeline) -> dict[str, int]:
        group = pipeline.group_for(principal_of(request), data.model)
        chat = to_chat_request(data.as_messages_request())
        backends = [d.backend for d in group.deployments]
        try:
            if tokenizer := next((b for b in backends if isinstance(b, Tokenizing)), None):
                return {"input_tokens": len(tokenizer.tokenize_chat(chat))}
            if counter := next((b for b in backends if isinstance(b, TokenCounting)), None):
                return {"input_tokens": await counter.count_chat_tokens(chat)}
        except BackendError as exc:
            raise from_backend_error(exc) from None
        return {"input_tokens": estimate_chat_prompt(chat)}
