"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec

from backends.openai_wire import ChatCompletion, ChatCompletionRequest
from gateway.calls import describe_chat
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post


class ChatController(Controller):
    path = "/"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @api_post(
        ["/v1/chat/completions", "/chat/completions"],  # also without /v1, as vLLM serves it
        ChatCompletionRequest,
        summary="Create a chat completion",
        description="OpenAI-compatible. With `stream: true` the answer is a `text/event-stream` of "
        "`chat.completion.chunk` objects, ending with `data: [DONE]`.",
        answer=ResponseSpec(ChatCompletion, description="The completion (or an SSE stream of chunks)",
                            generate_examples=False),
    )
    async def create(self, request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[Any]:
        return await create_chat(request, data)


async def create_chat(request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[Any]:
    """The route's work, for the controller and for ``gateway.fast_routes`` alike."""
    return await pipeline_of(request).serve(describe_chat(principal_of(request), data))
