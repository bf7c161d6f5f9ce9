"""``/v1/responses``: OpenAI's Responses API, passed through to deployments that serve it
(``responses_api: true``) and translated to chat for every other; answers are kept per tenant
(``store``, on by default as at OpenAI) for ``previous_response_id`` and the read endpoints.
``input_tokens`` and ``compact`` are ``gateway.controllers.responses_input``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from backends.base import Backend, BackendError, BadRequest, ChunkStream, Completed, Meter
from backends.call import CallContext
from backends.estimate import BOUND_PER_CONVERSATION, bound_text, estimate_text
from gateway.calls import CallDescription, describe_chat
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, pipeline_of, principal_of
from gateway.controllers.docs import api_post, error_responses
from gateway.controllers.polled import headed, json_answer
from gateway.dialects import Dialect
from gateway.dialects.responses import responses_dialect
from gateway.dialects.responses_params import responses_param
from gateway.dialects.responses_request import (
    ResponsesRequest,
    echoed_fields,
    listed,
    sent_items,
    wants_encrypted_reasoning,
)
from gateway.errors import ApiError
from gateway.held_events import held_events
from gateway.held_responses import UNFINISHED, finish_if_ended, kept_output, reach
from gateway.held_streams import OnEnd, OnHold, held_stream
from gateway.held_usage import unsettled
from gateway.responses_context import (
    Continued,
    chat_request,
    continued,
    native,
    passthrough_body,
    previous_of,
    serves_responses,
)
from gateway.services import Services
from gateway.stored_responses import Kept, ResponseStore
from gateway.streaming import SavedBeforeLast
from gateway.telemetry.context import request_id
from gateway.usage.pricing import HostedTools

log = logging.getLogger("switchyard.responses")


def _store(services: Services) -> ResponseStore | None:
    return services.responses


def _check_id(response_id: str) -> None:
    """A NUL in the path's id is a 400 naming it, as in any other path: PostgreSQL text cannot hold
    one (the lookup raised, a 500), and no id the gateway gives has one."""
    if "\x00" in response_id:
        raise ApiError(400, "response_id contains a NUL character (\\u0000), which is not allowed",
                       param="response_id", code="invalid_value")


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response with id '{response_id}' found.", param="response_id", code="not_found")


async def _polled(request: Request[Any, Any, Any], response_id: str) -> dict[str, str]:
    """Count a request about a stored response (read, stream, cancel, delete, list) against the requests/min
    of its key and tenant, as every request is (``Pipeline.admit_poll``: not its tokens/min,
    concurrency or budgets: a tenant whose budget is spent still reads and cancels what it started):
    its rate-limit headers, or a 429. Its id is checked first (a bad one is a 400, not counted)."""
    _check_id(response_id)
    return await pipeline_of(request).admit_poll(principal_of(request), "responses")


async def _kept(services: Services, principal: Principal, response_id: str) -> Kept:
    store = _store(services)
    kept = await store.get(principal, response_id) if store is not None else None
    if kept is None:
        raise _not_found(response_id)
    return kept


@contextmanager
def _upstream_knows(response_id: str) -> Iterator[None]:
    """A response the upstream running it no longer knows (its 404) is a 404, as one never stored."""
    try:
        yield
    except BackendError as exc:
        if exc.status == 404:
            raise _not_found(response_id) from None
        raise


def _passed_query(raw: bytes, stream: bool) -> str:
    """A request's query as it came, for the upstream, but ``stream`` as the gateway read it (``1``
    is ``true``: the upstream must answer what the gateway relays); a byte a request line cannot hold
    as it is (a space, a control or non-ASCII byte) percent-encoded."""
    query = "".join(chr(b) if 0x20 < b < 0x7F else f"%{b:02X}" for b in raw)
    return "&".join(f"stream={'true' if stream else 'false'}" if part.partition("=")[0] == "stream" else part
                    for part in query.split("&"))


async def _held_unmetered(answer: Awaitable[Completed[Any]], held: list[Meter]) -> Completed[Any]:
    """``answer``; one still running in the background settles its request at no tokens, its meter
    (the prompt estimated) appended to ``held``: its spend is metered when it ends (``gateway.held_usage``)."""
    done = await answer
    body = getattr(done.response, "body", None)
    if isinstance(body, dict) and body.get("status") in UNFINISHED:
        held.append(done.meter)
        done.meter = Meter(first_token_at=done.meter.first_token_at, upstream_request_id=done.meter.upstream_request_id)
    return done


def _described_for_passthrough(principal: Principal, data: ResponsesRequest, conversation: Continued,
                               inputs: list[dict[str, Any]], dialect: Dialect, served: list[str],
                               held: list[Meter] | None, holding: tuple[OnHold, OnEnd] | None) -> CallDescription:
    """A call whose deployments include one serving Responses itself: that one gets the request as
    sent (``passthrough_body``), its deployment's id appended to ``served``; any other (a fallback)
    gets it translated to chat when it is tried. ``held``: the answer is stored, so a background one
    is metered when it ends (``_held_unmetered``); streamed, ``holding`` holds it from its first event
    and ends it at its last (``gateway.held_streams``)."""
    body = passthrough_body(data, conversation, inputs)
    stream = bool(data.stream)
    hold = holding if body.get("background") is True else None

    def invoke(backend: Backend, ctx: CallContext) -> Awaitable[Completed[Any] | ChunkStream[Any]]:
        if serves_responses(backend):
            served.append(str(getattr(backend, "deployment_id", "")))
            if stream:
                opened = backend.respond_stream(body, ctx)
                return opened if hold is None else held_stream(opened, *hold)
            return backend.respond(body, ctx) if held is None else _held_unmetered(backend.respond(body, ctx), held)
        try:
            chat = chat_request(data, conversation)
        except ApiError as exc:
            raise BadRequest(exc.message, param=exc.param) from None
        return backend.chat_stream(chat, ctx) if stream else backend.chat(chat, ctx)

    limit = data.max_output_tokens if isinstance(data.max_output_tokens, int) else None
    return CallDescription(
        principal=principal, endpoint="responses", model=data.model, stream=stream,
        prompt_tokens=estimate_text(msgspec.json.encode(body.get("input")).decode()),
        prompt_bound=BOUND_PER_CONVERSATION + bound_text(msgspec.json.encode(body).decode()),  # every byte sent
        output_limit=limit, sequences=1, routing_key=None, invoke=invoke, dialect=dialect,
        output_field="max_output_tokens", hosted_tools=HostedTools.of(body.get("tools"), body.get("max_tool_calls")),
    )


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @api_post(
        "/",
        ResponsesRequest,
        summary="Create a model response (OpenAI Responses API)",
        description="Passed through to a deployment that serves the Responses API (`responses_api: true`), "
        "translated via chat completions for any other. With `stream: true` the answer is the Responses event "
        "stream. Answers are stored per tenant unless `store` is false, and `previous_response_id` continues a "
        "stored conversation.",
        answer=ResponseSpec(None, description="A `response` object (or its event stream)"),
    )
    async def create(self, request: Request[Any, Any, Any], data: ResponsesRequest,
                     services: Services) -> Response[Any]:
        principal, pipeline = principal_of(request), pipeline_of(request)
        group = pipeline.group_for(principal, data.model)
        previous = previous_of(data)
        conversation = await continued(pipeline, _store(services), principal, previous, native(group))
        context, upstream_previous = conversation.context, conversation.upstream_previous
        sent = sent_items(data)  # the input as the conversation keeps it (``listed`` with ids for ``input_items``)
        store = _store(services) if data.store is not False else None
        extra = echoed_fields(data) | {
            "previous_response_id": previous, "store": store is not None,
            "instructions": data.instructions if isinstance(data.instructions, str) else None}
        finished: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []  # the response, its output as kept
        relayed_extra = {"previous_response_id": previous} if conversation.kept else {}
        held_id: str | None = None  # a background stream's response, once held (``hold``): cut, its stream says so
        dialect = responses_dialect(extra, lambda final, output: finished.append((final, output)), relayed_extra,
                                    encrypted=wants_encrypted_reasoning(data), held=lambda: held_id)
        served: list[str] = []  # the deployment serving Responses that was called (the last one answered)
        held_meters: list[Meter] = []  # a background answer's own meter (``_held_unmetered``)
        saved: bool | None = None  # whether ``save`` stored the response (once)

        async def save() -> bool:
            """Store the response ``finished`` holds; True when it is held, its spend unsettled."""
            nonlocal saved
            if saved is not None or store is None:  # a held stream's, stored, then its end passes by
                return False
            final, output = finished[0]
            held = served[-1] if served and final.get("status") in UNFINISHED else None
            pending = None
            if held is not None and held_meters:
                provider = next((d.config.provider for d in group.deployments if d.id == held), None)
                pending = unsettled(principal, request_id(), data.model, group.name, held, provider,
                                    held_meters[-1].prompt_tokens, previous)
            kept = Kept(final, listed(sent), context + sent + kept_output(final, output), upstream_previous, held,
                        pending)
            try:
                saved = await store.save(principal, kept, previous)
            except Exception:  # the answer is produced and metered; only its later retrieval is lost
                log.exception("storing response %s failed", final.get("id"))
                saved = False
            if pending is not None and not saved:
                log.error("background response %s is not stored: its spend will not be metered", final.get("id"))
            return pending is not None and saved

        async def hold(response: dict[str, Any], prompt_estimate: int) -> bool:
            """A background stream's response, as its first event tells it: stored held."""
            nonlocal held_id
            held_meters.append(Meter(prompt_tokens=prompt_estimate, exact=False))
            finished.append((response | {"model": data.model} | relayed_extra, []))
            held = await save()
            held_id = str(response.get("id")) if held else None
            return held

        async def end(response: dict[str, Any], spent: Meter) -> None:
            """A held stream's response, as its last event tells it: stored finished and metered (once)."""
            if store is not None:
                named = response | {"model": data.model} | relayed_extra
                await finish_if_ended(pipeline, store, principal, str(response.get("id")), named, spent)

        if native(group):
            call = _described_for_passthrough(principal, data, conversation, sent, dialect, served,
                                              held_meters if store is not None else None,
                                              (hold, end) if store is not None else None)
        else:
            call = describe_chat(principal, chat_request(data, conversation), endpoint="responses", dialect=dialect)
        try:
            response = await pipeline.serve(call)
        except ApiError as exc:  # a chat request's field named as this request names it
            exc.param = responses_param(exc.param)
            raise
        if store is None:
            return response

        if isinstance(response, Stream):
            response.iterator = SavedBeforeLast(response.iterator, finished, save)  # type: ignore[arg-type]
        elif finished:
            await save()
        return response

    @get("/{response_id:str}", summary="Retrieve a stored response", responses=error_responses(),
         description="A response still running in the background is asked of the upstream that runs it, the "
         "query passed on as sent; with `stream=true` its events are streamed (after `starting_after`, if given).")
    async def retrieve(
        self, request: Request[Any, Any, Any], response_id: str, services: Services, stream: bool = False,
        include: Annotated[list[str] | None, Parameter(query="include[]")] = None,
    ) -> Response[Any]:
        headers = await _polled(request, response_id)
        with headed(headers):
            principal = principal_of(request)
            kept = await _kept(services, principal, response_id)
            store = _store(services)
            if kept.deployment is not None and store is not None:  # still running: the upstream answers
                query = _passed_query(request.scope.get("query_string", b""), stream)
                with _upstream_knows(response_id):
                    if stream:
                        return await held_events(pipeline_of(request), store, principal, response_id, kept, query,
                                                 headers)
                    return json_answer(await reach(pipeline_of(request), store, principal, response_id, kept, "GET",
                                               query=query), headers)
            # a stored response is read back as kept: no stream to replay, no fields to add to it
            if stream:
                raise ApiError(400, "a stored response cannot be streamed again; retrieve it without 'stream'",
                               param="stream", code="unsupported_parameter")
            if include or "include" in request.query_params:  # the SDK's include[], or a bare include
                raise ApiError(400, "'include' is not supported when retrieving a stored response: it is returned "
                               "as it was stored", param="include", code="unsupported_parameter")
            return json_answer(kept.response, headers)

    @post("/{response_id:str}/cancel", status_code=200, summary="Cancel a background response",
          responses=error_responses())
    async def cancel(self, request: Request[Any, Any, Any], response_id: str, services: Services) -> Response[Any]:
        headers = await _polled(request, response_id)
        with headed(headers):
            principal = principal_of(request)
            kept = await _kept(services, principal, response_id)
            store = _store(services)
            if kept.deployment is None or store is None:
                raise ApiError(400, f"Response '{response_id}' is not running in the background "
                               f"(it is {kept.response.get('status')}): only a background response can be cancelled",
                               param="response_id", code="invalid_request")
            with _upstream_knows(response_id):
                answer = await reach(pipeline_of(request), store, principal, response_id, kept, "POST", "/cancel")
                return json_answer(answer, headers)

    @delete("/{response_id:str}", status_code=200, summary="Delete a stored response", responses=error_responses())
    async def remove(self, request: Request[Any, Any, Any], response_id: str, services: Services) -> Response[Any]:
        headers = await _polled(request, response_id)
        with headed(headers):
            store = _store(services)
            if store is None or not await store.delete(principal_of(request), response_id):
                raise ApiError(404, f"No response with id '{response_id}' found.", param="response_id",
                               code="not_found")
            return json_answer({"id": response_id, "object": "response", "deleted": True}, headers)

    @get("/{response_id:str}/input_items", summary="List a stored response's input items",
         responses=error_responses())
    async def items(
        self, request: Request[Any, Any, Any], response_id: str, services: Services,
        limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> Response[Any]:
        headers = await _polled(request, response_id)
        with headed(headers):
            items = list((await _kept(services, principal_of(request), response_id)).input_items)
            if order == "desc":
                items.reverse()
            if after is not None:
                ids = [item.get("id") for item in items]
                if after not in ids:
                    raise ApiError(400, f"No input item with id '{after}' in this response.", param="after")
                items = items[ids.index(after) + 1:]
            page = items[:limit]
            return json_answer({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}, headers)
