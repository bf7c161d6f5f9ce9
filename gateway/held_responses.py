"""Responses an upstream serving the Responses API still runs in the background (``background:
true``: answered ``queued`` or ``in_progress``): kept by the gateway for their owner with the
deployment that holds them (``gateway.stored_responses``), so ``GET /v1/responses/{id}`` and
``cancel`` reach that deployment for the owner only, and the first answer that finds one finished is
stored in place of the placeholder.

Tokens the upstream spends in the background are not metered: the usage row of the request that
started it holds what that answer reported (the prompt estimated, no output).
"""

from __future__ import annotations

from typing import Any

from backends.base import ServesResponses, Unavailable
from gateway.contracts import Principal
from gateway.pipeline import Pipeline
from gateway.stored_responses import Kept, ResponseStore

UNFINISHED = frozenset({"queued", "in_progress"})  # what a response the upstream runs in the background says
CONTINUABLE = frozenset({"completed", "incomplete"})  # statuses whose output a conversation keeps


def kept_output(response: dict[str, Any], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``output`` where ``response`` finished with one a conversation continues from, else none."""
    return output if response.get("status") in CONTINUABLE else []


async def reach(pipeline: Pipeline, store: ResponseStore, principal: Principal, response_id: str, kept: Kept,
                method: str, action: str = "") -> dict[str, Any]:
    """The upstream's answer to ``method`` (``action``) on ``kept``, a response its deployment holds,
    named as the client named it; stored, if it says the response is finished."""
    stored = kept.response
    model = str(stored.get("model", ""))
    backend = next((d.backend for d in pipeline.group_for(principal, model).deployments
                    if d.id == kept.deployment), None)
    if not isinstance(backend, ServesResponses):
        raise Unavailable(f"deployment {kept.deployment}, which holds response {response_id}, is no longer "
                          f"a deployment of '{model}'")
    answer = await backend.held_response(method, response_id, action)
    answer |= {"model": model, "previous_response_id": stored.get("previous_response_id")}
    if answer.get("status") not in UNFINISHED:
        output = answer.get("output")
        await store.finish(principal, response_id, answer, kept_output(answer, output if isinstance(output, list)
                                                                         else []))
    return answer
