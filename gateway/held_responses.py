"""Responses an upstream serving the Responses API still runs in the background (``background:
true``: answered ``queued`` or ``in_progress``): kept by the gateway for their owner with the
deployment that holds them (``gateway.stored_responses``), so ``GET /v1/responses/{id}`` and
``cancel`` reach that deployment for the owner only, and the first answer that finds one finished is
stored in place of the placeholder.

Their spend is metered once, when they end (``gateway.held_usage``): by the ``GET`` or ``cancel``
that finds it ended, or by ``HeldFollower``, which asks the upstream about the ones nobody asks about.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from backends.base import ServesResponses, Unavailable
from gateway.background import stop_task
from gateway.contracts import Principal
from gateway.held_usage import meter_ended, starter
from gateway.pipeline import Pipeline
from gateway.stored_responses import Kept, ResponseStore

log = logging.getLogger("switchyard.responses")

UNFINISHED = frozenset({"queued", "in_progress"})  # what a response the upstream runs in the background says
CONTINUABLE = frozenset({"completed", "incomplete"})  # statuses whose output a conversation keeps
FOLLOW_BATCH = 16  # background responses the follower asks the upstreams about in one pass, one after another


def kept_output(response: dict[str, Any], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``output`` where ``response`` finished with one a conversation continues from, else none."""
    return output if response.get("status") in CONTINUABLE else []


def _holder(pipeline: Pipeline, principal: Principal, model: str, deployment: str | None,
            response_id: str) -> ServesResponses:
    backend = next((d.backend for d in pipeline.group_for(principal, model).deployments if d.id == deployment), None)
    if not isinstance(backend, ServesResponses):
        raise Unavailable(f"deployment {deployment}, which holds response {response_id}, is no longer "
                          f"a deployment of '{model}'")
    return backend


async def _ask(pipeline: Pipeline, store: ResponseStore, principal: Principal | None, response_id: str,
               backend: ServesResponses, fields: dict[str, Any], method: str, action: str = "") -> dict[str, Any]:
    """The upstream's answer (``fields`` set in it); stored and metered if it says the response ended."""
    answer = await backend.held_response(method, response_id, action)
    answer |= fields
    if answer.get("status") not in UNFINISHED:
        output = answer.get("output")
        await store.finish(principal, response_id, answer, kept_output(answer, output if isinstance(output, list)
                                                                         else []))
        await meter_ended(pipeline, store, response_id, answer)
    return answer


async def reach(pipeline: Pipeline, store: ResponseStore, principal: Principal, response_id: str, kept: Kept,
                method: str, action: str = "") -> dict[str, Any]:
    """The upstream's answer to ``method`` (``action``) on ``kept``, a response its deployment holds,
    named as the client named it; stored and metered, if it says the response is finished."""
    model = str(kept.response.get("model", ""))
    backend = _holder(pipeline, principal, model, kept.deployment, response_id)
    fields = {"model": model, "previous_response_id": kept.response.get("previous_response_id")}
    return await _ask(pipeline, store, principal, response_id, backend, fields, method, action)


class HeldFollower:
    """Every ``interval`` seconds, asks the upstreams how up to ``FOLLOW_BATCH`` background responses
    not metered yet stand (the next ones in id order, round and round), so that one nobody polls is
    metered (and stored finished) soon after it ends. Replicas may ask about the same one; only the
    first to claim its row meters it."""

    def __init__(self, pipeline: Pipeline, store: ResponseStore, interval: float) -> None:
        self._pipeline, self._store, self._interval = pipeline, store, interval
        self._after = ""  # the last id of the previous pass, when it was a full batch
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="held-responses-follower")

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.follow()
            except Exception:  # the database is down: the next pass tries again
                log.exception("following the background responses failed")

    async def follow(self) -> None:
        """One pass."""
        pending = await self._store.unsettled(FOLLOW_BATCH, self._after)
        self._after = pending[-1][0] if len(pending) == FOLLOW_BATCH else ""
        for response_id, held in pending:
            try:
                model = str(held.get("model", ""))
                backend = _holder(self._pipeline, starter(held), model, held.get("deployment"), response_id)
                fields = {"model": model, "previous_response_id": held.get("previous_response_id")}
                await _ask(self._pipeline, self._store, None, response_id, backend, fields, "GET")
            except Exception as exc:  # the upstream is down, the deployment gone: asked again next pass
                log.warning("asking how background response %s stands failed: %s", response_id, exc)
