"""``/v1/responses``: OpenAI's Responses API, translated to chat and routed like it; answers are kept
per tenant (``store``, on by default as at OpenAI) for ``previous_response_id`` and the read endpoints."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response, delete, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from gateway.body import WireBody
from gateway.calls import describe_chat
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, principal_of
from gateway.controllers.docs import error_responses
from gateway.dialects.responses import ResponsesRequest, input_items, responses_dialect, to_chat_request
from gateway.errors import ApiError
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.stored_responses import Kept, ResponseStore

log = logging.getLogger("switchyard.responses")


def _store(services: Services) -> ResponseStore | None:
    return services.responses


async def _kept(services: Services, principal: Principal, response_id: str) -> Kept:
    store = _store(services)
    kept = await store.get(principal, response_id) if store is not None else None
    if kept is None:
        raise ApiError(404, f"No response with id '{response_id}' found.", param="response_id", code="not_found")
    return kept


async def _saved_before_last(events: AsyncIterator[Any], finished: list[dict[str, Any]],
                             save: Callable[[], Awaitable[None]]) -> AsyncIterator[Any]:
    """Relay ``events``; the response is stored before the event that completes it is sent, so a
    client that continues from it at once finds it."""
    saved = False
    async for data in events:
        if finished and not saved:
            saved = True
            await save()
        yield data


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
        "`stream: true` the answer is the Responses event stream. Answers are stored per tenant unless "
        "`store` is false, and `previous_response_id` continues a stored conversation.",
        responses={200: ResponseSpec(None, description="A `response` object (or its event stream)"),
                   **error_responses()},
    )
    async def create(self, request: Request[Any, Any, Any], data: ResponsesRequest, pipeline: Pipeline,
                     services: Services) -> Response[Any]:
        principal = principal_of(request)
        previous = data.previous_response_id if isinstance(data.previous_response_id, str) else None
        context: list[dict[str, Any]] = []
        if previous is not None:
            store = _store(services)
            kept = await store.get(principal, previous) if store is not None else None
            if kept is None:
                raise ApiError(400, f"Previous response with id '{previous}' not found.",
                               param="previous_response_id", code="previous_response_not_found")
            context = kept.context
        chat = to_chat_request(data, context)
        inputs = input_items(data)
        store = _store(services) if data.store is not False else None
        extra = {"previous_response_id": previous, "store": store is not None,
                 "instructions": data.instructions if isinstance(data.instructions, str) else None}
        finished: list[dict[str, Any]] = []
        call = describe_chat(principal, chat, endpoint="responses", dialect=responses_dialect(extra, finished.append))
        response = await pipeline.serve(call)
        if store is None:
            return response

        async def save() -> None:
            final = finished[0]
            kept = Kept(final, inputs, context + inputs + list(final["output"]))
            try:
                await store.save(principal, kept, previous)
            except Exception:  # the answer is produced and metered; only its later retrieval is lost
                log.exception("storing response %s failed", final.get("id"))

        if isinstance(response, Stream):
            response.iterator = _saved_before_last(response.iterator, finished, save)  # type: ignore[arg-type]
        elif finished:
            await save()
        return response

    @get("/{response_id:str}", summary="Retrieve a stored response", responses=error_responses())
    async def retrieve(self, request: Request[Any, Any, Any], response_id: str,
                       services: Services) -> dict[str, Any]:
        return (await _kept(services, principal_of(request), response_id)).response

    @delete("/{response_id:str}", status_code=200, summary="Delete a stored response", responses=error_responses())
    async def remove(self, request: Request[Any, Any, Any], response_id: str, services: Services) -> dict[str, Any]:
        store = _store(services)
        if store is None or not await store.delete(principal_of(request), response_id):
            raise ApiError(404, f"No response with id '{response_id}' found.", param="response_id",
                           code="not_found")
        return {"id": response_id, "object": "response", "deleted": True}

    @get("/{response_id:str}/input_items", summary="List a stored response's input items",
         responses=error_responses())
    async def items(
        self, request: Request[Any, Any, Any], response_id: str, services: Services,
        limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        items = list((await _kept(services, principal_of(request), response_id)).input_items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise ApiError(400, f"No input item with id '{after}' in this response.", param="after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
