"""What a Responses request continues, and the request as each kind of deployment gets it: the kept
conversation ``previous_response_id`` names (``continued``), the body for an upstream serving
Responses itself (``passthrough_body``) and the chat request for any other (``chat_request``).
Shared by ``create``, ``input_tokens`` and ``compact``, so a count sees the prompt a call would send."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

from backends.base import ServesResponses
from backends.openai_wire import ChatCompletionRequest
from gateway.contracts import Principal
from gateway.dialects.responses_reasoning import TRANSLATED_REASONING
from gateway.dialects.responses_request import ResponsesRequest, raw_request, to_chat_request
from gateway.errors import ApiError
from gateway.held_responses import CONTINUABLE, reach
from gateway.pipeline import Pipeline
from gateway.routing.router import ModelGroup
from gateway.stored_responses import Kept, ResponseStore


@dataclass(frozen=True)
class Continued:
    """The conversation a request continues: ``context``, its kept items (``kept``: the gateway
    holds the previous response); ``upstream_previous``, a response only an upstream serving
    Responses holds, where the conversation (or the request itself) goes back to one."""

    context: list[dict[str, Any]] = field(default_factory=list)
    kept: bool = False
    upstream_previous: str | None = None


def serves_responses(backend: Any) -> TypeGuard[ServesResponses]:
    return isinstance(backend, ServesResponses) and backend.serves_responses()


def native(group: ModelGroup) -> bool:
    """Whether a deployment of ``group`` serves the Responses API itself (it gets requests as sent)."""
    return any(serves_responses(d.backend) for d in group.deployments)


def previous_of(data: ResponsesRequest) -> str | None:
    return data.previous_response_id if isinstance(data.previous_response_id, str) else None


async def continued(pipeline: Pipeline, store: ResponseStore | None, principal: Principal, previous: str | None,
                    native: bool) -> Continued:
    """The conversation ``previous`` names for ``principal``: a kept one (one still running in the
    background is asked how it stands first); else, where a deployment serves Responses itself, the
    upstream's own id; else (unknown, another tenant's, deleted: never passed on, as the upstream
    would resolve it for anyone) a 400 naming ``previous_response_id``."""
    if previous is None:
        return Continued()
    kept = await store.get(principal, previous) if store is not None else None
    if kept is not None and kept.deployment is not None and store is not None:  # ask how it stands
        await reach(pipeline, store, principal, previous, kept, "GET")
        kept = await store.get(principal, previous)
    if kept is not None:
        _check_continuable(previous, kept)
        return Continued(kept.context, True, kept.upstream_previous_id)
    if native and not (store is not None and await store.withheld(principal, previous)):
        return Continued(upstream_previous=previous)  # an upstream serving Responses may know it; nothing else can
    raise ApiError(400, f"Previous response with id '{previous}' not found.",
                   param="previous_response_id", code="previous_response_not_found")


def _check_continuable(previous: str, kept: Kept) -> None:
    """A kept response a conversation cannot continue from (one still running in the background,
    failed or cancelled) is a 400 naming ``previous_response_id``: there is no answer to continue."""
    status = kept.response.get("status")
    if status not in CONTINUABLE:
        raise ApiError(400, f"Previous response with id '{previous}' is {status}: only a completed or "
                       "incomplete response can be continued", param="previous_response_id", code="invalid_value")


def _for_upstream(item: dict[str, Any]) -> dict[str, Any]:
    """A kept conversation item sent again as input: a message or function call without its id and
    status (conversations kept before ``sent_items`` hold the ones this gateway gave them)."""
    if item.get("type") in ("message", "function_call", "function_call_output"):
        return {k: v for k, v in item.items() if k not in ("id", "status")}
    return item


def _translated_reasoning(item: dict[str, Any]) -> bool:
    """A reasoning item this gateway made of a chat provider's reasoning text (see ``TRANSLATED_REASONING``)."""
    return item.get("type") == "reasoning" and str(item.get("id", "")).startswith(TRANSLATED_REASONING)


def passthrough_body(data: ResponsesRequest, conversation: Continued, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The request as sent, for an upstream serving Responses: a kept conversation's items put before
    the input (``inputs``, as ``sent_items`` gives them) in place of ``previous_response_id``, which
    then names ``upstream_previous``: where the kept conversation began from a response only the
    upstream holds."""
    body = raw_request(data)
    if conversation.kept:
        body.pop("previous_response_id", None)
        if conversation.upstream_previous is not None:
            body["previous_response_id"] = conversation.upstream_previous
        items = conversation.context + inputs
        body["input"] = [_for_upstream(item) for item in items if not _translated_reasoning(item)]
    return body


def chat_request(data: ResponsesRequest, conversation: Continued) -> ChatCompletionRequest:
    """``data`` as a chat request continuing the conversation; one that goes back to a response only
    an upstream serving Responses holds is a 400 naming ``previous_response_id``: chat cannot reach
    those turns, and would answer without them."""
    if (upstream_previous := conversation.upstream_previous) is not None:
        raise ApiError(400, f"the conversation previous_response_id continues goes back to response "
                       f"'{upstream_previous}', which only an upstream serving the Responses API holds; this "
                       "model is served through chat completions, which cannot continue it",
                       param="previous_response_id", code="unsupported_parameter")
    return to_chat_request(data, conversation.context)
