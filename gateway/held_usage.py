"""The spend of a background response (``background: true`` on an upstream serving Responses),
metered once, when it ends.

The request that starts one is answered ``queued`` (or ``in_progress``) before the upstream has
spent anything it can report: its usage row records no tokens, and its stored row keeps, in
``unsettled``, who started it and what its usage row needs (``unsettled``). The first to find it
ended (``completed``, ``failed``, ``cancelled``, ``incomplete``) meters it (``meter_ended``): a
``GET`` or ``cancel`` relayed to the upstream, or the gateway's follower
(``gateway.held_responses.HeldFollower``) for one nobody asks about. Claiming the row
(``ResponseStore.claim``) makes that one caller of any replica, for ``LEASE_SECONDS``: it records
one usage row, with the upstream's usage (its estimate where it reports none) at the current
prices, then counts it against the key's and tenant's budgets (``Admission.charge``), then settles
the row (``ResponseStore.settle``). One that can no longer be asked about (its deployment gone, its
upstream forgot it, or asking kept failing too long) is metered so by the follower too
(``meter_lost``), with the prompt estimate alone.

A meterer that dies before it settles the row (SIGKILL, a crash, a cancelled metering), or cannot
settle it (the database down), leaves it unsettled: once its lease has run out, the follower (or a
``GET`` or ``cancel``) meters it again. Its usage row has one id per response (``usage_id``), so the
record written again (and the dead one's, replayed from its write-ahead segment) is one row; and its
charge is made under that id (``once``), which the quota store notes in the same atomic step as it
adds the charge and keeps for days (``store.ONCE_SECONDS``): a charge Redis ran (the meterer died
while it waited for the reply, or before it settled the row) is not counted again, one that never
reached Redis is counted now. A meterer still alive when its lease runs out (stalled longer than
``LEASE_SECONDS``) that meets a second one is counted once so too.

A charge whose reply does not come (Redis unreachable or too slow: it may or may not have run) is
an outage of the quota store (``quotas/stale.py``): the meterer goes on to settle the row, and its
process has the budget buckets rebuilt from the usage rows once Redis answers, which hold this
one (the record comes first for that reason: the rows are the account). A process that dies
before that repair leaves the buckets as Redis left them: charged once if the charge ran, not at
all if it never reached Redis. A bucket rebuilt from the usage rows while a response is metered
(Redis restarted empty, its once-keys gone with it; a budget set meanwhile) counts the row if it
was in the database then, and notes, in the same atomic step as it is written, the once-keys of
the responses still unsettled whose rows it counted (``quotas/recorded.py``): their charges, when
they come (a meterer that had not charged yet, or one metering again after its meterer died),
add nothing to it, and a row it did not count (still on its way from a replica's writer) is
counted by its charge, if that comes after the rebuild (one that ran while the bucket was missing
added nothing: such a row is missed, as any record on its way is).

One started with ``stream: true`` is held so from its stream's first event (``gateway.held_streams``):
its stream's last event meters it (with what the stream metered) unless a ``GET``, ``cancel`` or the
follower found it ended first; one whose stream ends before (the client gone, the drain, the
upstream's connection broken) stays held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from backends.base import Meter
from backends.responses_http import answer_meter
from gateway.contracts import Principal, UsageRecord, UsageSink
from gateway.pipeline import Pipeline
from gateway.stored_responses import ResponseStore, usage_id

log = logging.getLogger("switchyard.responses")

LEASE_SECONDS = 120.0  # how long a claim on a response's spend holds, for its meterer to settle it


def unsettled(principal: Principal, request_id: str, model: str, group: str, deployment: str, provider: str | None,
              prompt_estimate: int, previous_response_id: str | None) -> dict[str, Any]:
    """What a background response's stored row keeps until its spend is metered (``model``: as the
    client named it; ``group``: the model its usage row names; ``request_id``: the request that started it)."""
    return {"key_id": principal.key_id, "tenant_id": principal.tenant_id, "request_id": request_id, "model": model,
            "group": group, "deployment": deployment, "provider": provider, "prompt_estimate": prompt_estimate,
            "previous_response_id": previous_response_id, "started_at": time.time()}


def starter(pending: dict[str, Any]) -> Principal:
    """The caller that started the background response ``pending`` describes."""
    return Principal(key_id=str(pending["key_id"]), tenant_id=pending.get("tenant_id"))


async def meter_ended(pipeline: Pipeline, store: ResponseStore, response_id: str, answer: dict[str, Any],
                      spent: Meter | None = None) -> None:
    """Meter the spend of ``response_id``, which ``answer`` (the upstream's) says has ended, unless
    another caller has claimed it: its usage row first, then its budgets, then the row settled;
    ``spent``: what its stream metered, where its own stream relayed its end (else ``answer``'s usage).
    Once claimed, that runs to its end in a task of its own, though the caller is cancelled (a
    client that left its ``GET``, the follower stopped): cut, the row would wait for its lease to run
    out to be metered again."""
    pending = await store.claim(response_id, LEASE_SECONDS)
    if pending is not None:
        await asyncio.shield(asyncio.ensure_future(_meter_claimed(pipeline, store, response_id, answer, pending,
                                                                  spent)))


async def _meter_claimed(pipeline: Pipeline, store: ResponseStore, response_id: str, answer: dict[str, Any],
                         pending: dict[str, Any], spent: Meter | None) -> None:
    spent = spent if spent is not None else answer_meter(answer, int(pending.get("prompt_estimate") or 0))
    principal, deployment, group = starter(pending), pending.get("deployment"), str(pending.get("group", ""))
    cost = pipeline.cost(deployment, group, spent)
    services = pipeline.services
    _recorded(services.usage, _record(principal, response_id, pending, spent, cost, str(answer.get("status"))),
              response_id)
    try:
        await services.usage.sync()
    except Exception:
        log.exception("recording the usage of background response %s failed", response_id)
    await services.admission.charge(principal, spent.total_tokens, cost, once=usage_id(response_id))
    await store.settle(response_id)


async def meter_lost(pipeline: Pipeline, store: ResponseStore, response_id: str, outcome: str) -> None:
    """Meter what is known of ``response_id``, which can no longer be asked about (``outcome``:
    ``lost``, its deployment or upstream forgot it; ``expired``, asking kept failing): the prompt
    its creating request estimated, unless another caller has claimed it."""
    await meter_ended(pipeline, store, response_id, {"id": response_id, "status": outcome})


def _recorded(usage: UsageSink, record: UsageRecord, response_id: str) -> None:
    try:
        usage.record(record)
    except Exception:
        log.exception("recording the usage of background response %s failed", response_id)


def _record(principal: Principal, response_id: str, pending: dict[str, Any], spent: Meter, cost: float,
            status: str) -> UsageRecord:
    started = float(pending.get("started_at") or time.time())
    return UsageRecord(
        request_id=usage_id(response_id), key_id=principal.key_id, tenant_id=principal.tenant_id,
        model=str(pending.get("group", "")), deployment=pending.get("deployment"), provider=pending.get("provider"),
        endpoint="responses", started_at=started, status=200, prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens, cached_tokens=spent.cached_tokens, exact=spent.exact, cost=cost,
        error_type=None if status == "completed" else status, latency_ms=(time.time() - started) * 1000,
        service_tier=spent.service_tier, extra={"outcome": status},
    )
