"""``POST /v1/messages``: Anthropic's Messages API, routed like chat completions; errors in
Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from litestar import Controller, Request, Response, post
from litestar.openapi.datastructures import ResponseSpec

from gateway.anthropic_api import MessagesEvents, MessagesRequest, message_body, to_chat_request
from gateway.body import WireBody
from gateway.controllers.auth import authenticate_request, principal_of
from gateway.controllers.docs import error_responses
from gateway.errors import exception_handlers
from gateway.calls import Dialect, describe_chat
from gateway.pipeline import Pipeline

ANTHROPIC = Dialect(unary=message_body, stream=MessagesEvents)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _in_anthropic_shape(handler: Callable[[Request[Any, Any, Any], Any], Response[bytes]]) -> Callable[..., Any]:
    """Wrap one of the gateway's exception handlers to answer in Anthropic's error shape."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        response = handler(request, exc)
        error = msgspec.json.decode(response.content)["error"]
        body = {"type": "error", "error": {"type": _ERROR_TYPES.get(response.status_code, "api_error"),
                                           "message": error["message"]}}
        return Response(content=msgspec.json.encode(body), status_code=response.status_code,
                        media_type="application/json", headers=dict(response.headers))

    return handle


class MessagesController(Controller):
    path = "/v1/messages"
    tags = ["Anthropic"]
    before_request = authenticate_request
    exception_handlers = {exc: _in_anthropic_shape(h) for exc, h in exception_handlers.items()}  # type: ignore[assignment]

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
    async def create(self, request: Request[Any, Any, Any], data: MessagesRequest, pipeline: Pipeline) -> Response[Any]:
        call = describe_chat(principal_of(request), to_chat_request(data), endpoint="messages", dialect=ANTHROPIC)
        return await pipeline.serve(call)
