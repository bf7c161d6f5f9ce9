"""Responses an upstream serving the Responses API still runs in the background (``background:
true``: answered ``queued`` or ``in_progress``): kept by the gateway for their owner with the
deployment that holds them (``gateway.stored_responses``), so ``GET /v1/responses/{id}`` (its event
stream too: ``gateway.held_events``) and ``cancel`` reach that deployment for the owner only, and the
first answer that finds one finished is stored in place of the placeholder.

Their spend is metered once, when they end (``gateway.held_usage``): by the ``GET`` (or stream) or
``cancel`` that finds it ended, or by ``HeldFollower``, which asks the upstream about the ones nobody
asks about (and meters again one whose meterer died before it was done).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from backends.base import BackendError, Meter, ServesResponses, Unavailable
from gateway.background import Stopping
from gateway.contracts import Principal
from gateway.held_usage import meter_ended, meter_lost
from gateway.pipeline import Pipeline
from gateway.stored_responses import Kept, ResponseStore

log = logging.getLogger("switchyard.responses")

UNFINISHED = frozenset({"queued", "in_progress"})  # what a response the upstream runs in the background says
CONTINUABLE = frozenset({"completed", "incomplete"})  # statuses whose output a conversation keeps
FOLLOW_BATCH = 16  # background responses the follower asks the upstreams about in one pass, one after another
SCAN_PAGE = 64  # rows the follower reads at a time, skipping those waiting out a backoff
BACKOFF_FIRST = 60.0  # seconds before a response whose asking failed is asked again; doubled at each failure
BACKOFF_MAX = 3600.0
STOP_SECONDS = 5.0  # at shutdown, for the response being asked about to be done with
GIVE_UP_AFTER = 24 * 3600.0  # seconds since it started after which one whose asking keeps failing is metered


def kept_output(response: dict[str, Any], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``output`` where ``response`` finished with one a conversation continues from, else none."""
    return output if response.get("status") in CONTINUABLE else []


def holder(pipeline: Pipeline, principal: Principal, model: str, deployment: str | None,
           response_id: str) -> ServesResponses:
    """The backend of ``deployment``, which holds ``response_id``, a response of ``model`` (as the client named it)."""
    backend = next((d.backend for d in pipeline.group_for(principal, model).deployments if d.id == deployment), None)
    if not isinstance(backend, ServesResponses):
        raise Unavailable(f"response {response_id} is held by an upstream no longer serving '{model}'")
    return backend


async def _ask(pipeline: Pipeline, store: ResponseStore, principal: Principal | None, response_id: str,
               backend: ServesResponses, fields: dict[str, Any], method: str, action: str = "",
               query: str = "") -> dict[str, Any]:
    """The upstream's answer (``fields`` set in it); stored and metered if it says the response ended."""
    answer = await backend.held_response(method, response_id, action, query)
    answer |= fields
    await finish_if_ended(pipeline, store, principal, response_id, answer)
    return answer


async def finish_if_ended(pipeline: Pipeline, store: ResponseStore, principal: Principal | None, response_id: str,
                          answer: dict[str, Any], spent: Meter | None = None) -> None:
    """Store ``answer`` in place of held ``response_id`` and meter its spend (``spent``: what its own
    stream metered, if that relayed the end), if it says the response ended (each once, whoever
    finds it so first)."""
    if answer.get("status") not in UNFINISHED:
        output = answer.get("output")
        await store.finish(principal, response_id, answer, kept_output(answer, output if isinstance(output, list)
                                                                         else []))
        await meter_ended(pipeline, store, response_id, answer, spent)


def named(kept: Kept) -> dict[str, Any]:
    """The fields an upstream's answer about ``kept`` gets as the client named them."""
    return {"model": str(kept.response.get("model", "")), "previous_response_id": kept.response.get(
        "previous_response_id")}


async def reach(pipeline: Pipeline, store: ResponseStore, principal: Principal, response_id: str, kept: Kept,
                method: str, action: str = "", query: str = "") -> dict[str, Any]:
    """The upstream's answer to ``method`` (``action``, the client's ``query``) on ``kept``, a response
    its deployment holds, named as the client named it; stored and metered, if it says the response
    is finished."""
    fields = named(kept)
    backend = holder(pipeline, principal, fields["model"], kept.deployment, response_id)
    return await _ask(pipeline, store, principal, response_id, backend, fields, method, action, query)


class HeldFollower:
    """Every ``interval`` seconds, asks the upstreams how up to ``FOLLOW_BATCH`` background responses
    not metered yet stand (the next ones in id order, round and round), so that one nobody polls is
    metered (and stored finished) soon after it ends. Replicas may ask about the same one; only the
    first to claim its row meters it. One being metered (its claim's lease running) is left out; one
    whose lease ran out unsettled (its meterer died) is asked about again, and metered again.

    One that can never be answered ends too, metered with what is known (``meter_lost``): at once
    when its deployment is gone from the config or its upstream answers 404 for it (``lost``); one
    whose asking keeps failing is asked again after a backoff that doubles (``BACKOFF_FIRST`` to
    ``BACKOFF_MAX``; rows waiting one out take no place in a pass), and once it is older than
    ``GIVE_UP_AFTER`` (``expired``)."""

    def __init__(self, pipeline: Pipeline, store: ResponseStore, interval: float) -> None:
        self._pipeline, self._store, self._interval = pipeline, store, interval
        self._after = ""  # the last id the previous pass reached
        self._failing: dict[str, tuple[int, float]] = {}  # id -> (failures in a row, monotonic time to ask again)
        self._round: set[str] = set()  # the ids seen since the pass that began at the first id
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="held-responses-follower")

    async def aclose(self) -> None:
        """End after the pass under way (it claims and meters rows: not cut mid-statement)."""
        if self._task is not None:
            await self._stopping.stop(self._task, STOP_SECONDS)

    async def _run(self) -> None:
        while not await self._stopping.pause(self._interval):
            try:
                await self.follow()
            except Exception:  # the database is down: the next pass tries again
                log.exception("following the background responses failed")

    async def follow(self) -> None:
        """One pass: the next ``FOLLOW_BATCH`` responses not waiting out a backoff, at most once round."""
        start, asked, wrapped = self._after, 0, False
        while True:
            page = await self._store.unsettled(SCAN_PAGE, self._after)
            for response_id, held in page:
                if wrapped and response_id >= start:  # once round
                    return
                self._after = response_id
                self._round.add(response_id)
                failing = self._failing.get(response_id)
                if failing is not None and time.time() - float(held.get("started_at") or 0) > GIVE_UP_AFTER:
                    log.error("background response %s could not be asked about since %.0f s: metered as it "
                              "stood", response_id, time.time() - float(held.get("started_at") or 0))
                    await self._ended(response_id, "expired")
                    continue
                if failing is not None and failing[1] > time.monotonic():
                    continue
                await self._follow_one(response_id, held)
                asked += 1
                if asked == FOLLOW_BATCH or self._stopping.requested:
                    return
            if len(page) == SCAN_PAGE:
                continue
            self._after = ""  # the last one: the next pass begins at the first
            self._failing = {k: v for k, v in self._failing.items() if k in self._round}  # the others are metered
            self._round = set()
            if wrapped or not start:
                return
            wrapped = True

    async def _follow_one(self, response_id: str, held: dict[str, Any]) -> None:
        model, deployment = str(held.get("model", "")), held.get("deployment")
        backend = _holding(self._pipeline, model, deployment)
        try:
            if backend is None:
                log.error("background response %s is held by deployment %s, no longer one of '%s': metered "
                          "as it stood", response_id, deployment, model)
                return await self._ended(response_id, "lost")
            fields = {"model": model, "previous_response_id": held.get("previous_response_id")}
            await _ask(self._pipeline, self._store, None, response_id, backend, fields, "GET")
            self._failing.pop(response_id, None)
        except BackendError as exc:
            if exc.status != 404:
                return self._failed(response_id, exc)
            log.error("the upstream of deployment %s no longer knows background response %s: metered as it "
                      "stood", deployment, response_id)
            await self._ended(response_id, "lost")
        except Exception as exc:  # the database is down
            self._failed(response_id, exc)

    def _failed(self, response_id: str, exc: Exception) -> None:
        failures = self._failing.get(response_id, (0, 0.0))[0] + 1
        wait = min(BACKOFF_FIRST * 2 ** (failures - 1), BACKOFF_MAX)
        self._failing[response_id] = (failures, time.monotonic() + wait)
        log.warning("asking how background response %s stands failed (%d in a row; again in %.0f s): %s",
                    response_id, failures, wait, exc)

    async def _ended(self, response_id: str, outcome: str) -> None:
        await meter_lost(self._pipeline, self._store, response_id, outcome)
        self._failing.pop(response_id, None)


def _holding(pipeline: Pipeline, model: str, deployment: str | None) -> ServesResponses | None:
    """The backend of ``deployment``, a deployment of ``model`` (as the client named it) serving
    Responses; None when the config no longer has it."""
    group = pipeline.services.router.resolve(model)
    backend = next((d.backend for d in group.deployments if d.id == deployment), None) if group else None
    return backend if isinstance(backend, ServesResponses) else None
