"""``POST /v1/embeddings``: routed, limited and metered (input tokens) like every other call."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec
from msgspec import UNSET

from backends.base import Backend, ChunkStream, Completed
from backends.call import CallContext
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.estimate import bound_embedding_input, estimate_embedding_input
from backends.openai_wire import raw_fields
from gateway.calls import CallDescription
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post
from gateway.errors import ApiError


def describe_embeddings(principal: Principal, body: EmbeddingRequest) -> CallDescription:
    """Embeddings generate nothing: admission reserves the input alone."""
    try:
        inputs = body.inputs()
    except ValueError as exc:
        raise ApiError(400, str(exc), param="input") from None
    if body.encoding_format is None:  # null: the default (float), as OpenAI takes it; left out upstream,
        body.encoding_format = UNSET  # where a null may be refused (vLLM's field is not nullable)
        if (sent := raw_fields(body)) is not None:
            sent.pop("encoding_format", None)

    def invoke(backend: Backend, ctx: CallContext) -> Awaitable[Completed[Any] | ChunkStream[Any]]:
        return backend.embed(body, ctx)

    first = inputs[0]
    return CallDescription(
        principal=principal, endpoint="embeddings", model=body.model, stream=False,
        prompt_tokens=estimate_embedding_input(body), prompt_bound=bound_embedding_input(body), output_limit=0,
        sequences=len(inputs),
        routing_key=first if isinstance(first, str) else " ".join(map(str, first)), invoke=invoke,
        output_field=None,
    )


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @api_post(
        "/",
        EmbeddingRequest,
        summary="Create embeddings",
        description="OpenAI-compatible: `input` is a string, a list of strings, token ids or lists of token ids; "
        "`encoding_format` `float` (default) or `base64`.",
        answer=ResponseSpec(EmbeddingList, description="The embeddings", generate_examples=False),
    )
    async def create(self, request: Request[Any, Any, Any], data: EmbeddingRequest) -> Response[Any]:
        return await pipeline_of(request).serve(describe_embeddings(principal_of(request), data))
