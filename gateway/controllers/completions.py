"""``POST /v1/completions`` (legacy text completions)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec

from backends.openai_wire import CompletionRequest, TextCompletion
from gateway.calls import describe_completion
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post


class CompletionsController(Controller):
    path = "/"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @api_post(
        ["/v1/completions", "/completions"],  # also without /v1, as vLLM serves it
        CompletionRequest,
        summary="Create a text completion",
        description="OpenAI-compatible. With `stream: true` the answer is a `text/event-stream` of "
        "`text_completion` chunks, ending with `data: [DONE]`.",
        answer=ResponseSpec(TextCompletion, description="The completion (or an SSE stream of chunks)",
                            generate_examples=False),
    )
    async def create(self, request: Request[Any, Any, Any], data: CompletionRequest) -> Response[Any]:
        return await create_completion(request, data)


async def create_completion(request: Request[Any, Any, Any], data: CompletionRequest) -> Response[Any]:
    """The route's work, for the controller and for ``gateway.fast_routes`` alike."""
    return await pipeline_of(request).serve(describe_completion(principal_of(request), data))
