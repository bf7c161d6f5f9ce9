"""``POST /v1/responses``: OpenAI's Responses API, translated to chat and routed like it."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.openapi.datastructures import ResponseSpec

from gateway.body import WireBody
from gateway.calls import describe_chat
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import error_responses
from gateway.dialects.responses import RESPONSES, ResponsesRequest, to_chat_request


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @post(
        "/",
        status_code=200,
        dto=WireBody[ResponsesRequest],
        return_dto=None,
        summary="Create a model response (OpenAI Responses API)",
        description="Served by any provider behind the model (translated via chat completions). With "
        "`stream: true` the answer is the Responses event stream.",
        responses={200: ResponseSpec(None, description="A `response` object (or its event stream)"),
                   **error_responses()},
    )
    async def create(self, request: Request[Any, Any, Any], data: ResponsesRequest) -> Response[Any]:
        call = describe_chat(principal_of(request), to_chat_request(data), endpoint="responses", dialect=RESPONSES)
        return await pipeline_of(request).serve(call)
