"""Responses API answers kept in SQL per tenant: ``store``, ``previous_response_id`` and the
``GET``/``DELETE``/``input_items`` endpoints read and write them here.

A caller only ever sees what its own owner scope stored: the tenant, or the key itself for keys
without a tenant (admin keys). A row not visible to the caller is reported exactly like a missing one.
A row, once stored, is never replaced: a second answer under a stored id (an upstream serving
Responses that reuses its ids) is not kept, so no answer overwrites or takes over another's. A
deleted row stays as a tombstone (owned by no one, holding nothing): the upstream that answered it
still holds the response, and its id must not become one the gateway passes on to it.

Every answer of an upstream serving Responses is kept so (unless ``store: false``), whatever its
status, so its id is owned: one it still runs in the background (``queued``, ``in_progress``)
keeps the ``deployment`` that holds it, for ``GET`` and ``cancel`` to reach, until ``finish`` stores
it finished (once: the first caller to see it so), and its spend, until it is metered (``claim``,
then ``settle``: ``gateway.held_usage``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, null, or_, select, update
from sqlalchemy.exc import IntegrityError

from gateway.contracts import Principal
from gateway.db.engine import Database
from gateway.db.models import StoredResponse

log = logging.getLogger("switchyard.responses")

DELETED = "deleted"  # the owner of a deleted response's tombstone: no caller's (``owner_of``)


def usage_id(response_id: str) -> str:
    """The request id of a background response's usage row (``gateway.held_usage``): one per response,
    so a row written twice (a journal replayed, a response metered again after its meterer died) is
    one row; its charge is made under it too (``once``)."""
    return "bg-" + hashlib.sha256(response_id.encode()).hexdigest()[:40]


def owner_of(principal: Principal) -> str:
    return principal.tenant_id if principal.tenant_id is not None else f"key:{principal.key_id}"


@dataclass(frozen=True)
class Kept:
    """One stored answer: the response object, its own input items, and the whole conversation
    (earlier context, this input, this output) a continuation starts from. ``upstream_previous_id``:
    when the conversation began by continuing a response only the upstream holds (an id the gateway
    never kept), that id, for the upstream to resolve the turns before ``context``."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    context: list[dict[str, Any]]
    upstream_previous_id: str | None = None
    deployment: str | None = None  # the deployment still running it in the background, if any
    unsettled: dict[str, Any] | None = None  # its spend, not metered yet (``gateway.held_usage``)


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def save(self, principal: Principal, kept: Kept, previous_response_id: str | None) -> bool:
        """Store ``kept``; False (logged) when its id is already stored, for this owner or another,
        and that row is left as it is."""
        response = kept.response
        row = StoredResponse(
            id=response["id"], owner=owner_of(principal), model=str(response.get("model", "")),
            created_at=datetime.fromtimestamp(int(response.get("created_at") or 0), UTC),
            previous_response_id=previous_response_id, upstream_previous_id=kept.upstream_previous_id,
            deployment=kept.deployment, input_items=kept.input_items, context=kept.context, response=response,
            unsettled=kept.unsettled,
        )
        async with self._db.session() as s:
            s.add(row)  # an insert, never a merge: an existing row keeps its answer and its owner
            try:
                await s.commit()
            except IntegrityError:
                await s.rollback()
                log.warning("response %s not stored: a response with that id is already stored (the upstream "
                            "reused the id); the stored one is kept", row.id)
                return False
        return True

    async def get(self, principal: Principal, response_id: str) -> Kept | None:
        async with self._db.session() as s:
            row = (await s.execute(select(StoredResponse).where(
                StoredResponse.id == response_id, StoredResponse.owner == owner_of(principal)))).scalar_one_or_none()
        if row is None:
            return None
        return Kept(row.response, row.input_items, row.context, row.upstream_previous_id, row.deployment)

    async def finish(self, principal: Principal | None, response_id: str, response: dict[str, Any],
                     output: list[dict[str, Any]]) -> bool:
        """Store the finished ``response`` of one the upstream held in the background, ``output`` added
        to its conversation; False when it is not (or no longer) held: another caller finished it first.
        ``principal`` None: whoever owns it (the gateway's own follower, ``gateway.held_usage``)."""
        held = (StoredResponse.id == response_id, StoredResponse.deployment.is_not(None),
                *(() if principal is None else (StoredResponse.owner == owner_of(principal),)))
        async with self._db.session() as s:
            context = (await s.execute(select(StoredResponse.context).where(*held))).scalar_one_or_none()
            if context is None:
                return False
            # the row still held, else another caller finished it in between: one finishes it
            result = await s.execute(update(StoredResponse).where(*held).values(
                response=response, context=[*context, *output], deployment=None))
            await s.commit()
        return bool(getattr(result, "rowcount", 0))

    async def claim(self, response_id: str, lease: float) -> dict[str, Any] | None:
        """Take the unmetered spend of ``response_id`` to meter it, for ``lease`` seconds: what its
        ``unsettled`` holds, to one caller of any replica at a time (the conditional update is the
        claim); None for the others, and once it is settled. It stays unsettled until ``settle``:
        one whose meterer died (its lease ran out first) is claimed again."""
        now = time.time()
        claimable = (StoredResponse.id == response_id, StoredResponse.unsettled.is_not(None), _unleased(now))
        async with self._db.session() as s:
            found = (await s.execute(select(StoredResponse.unsettled).where(*claimable))).scalar_one_or_none()
            if found is None:
                return None
            result = await s.execute(update(StoredResponse).where(*claimable).values(metering_until=now + lease))
            await s.commit()
        return found if getattr(result, "rowcount", 0) else None

    async def settle(self, response_id: str) -> None:
        """The spend of ``response_id``, claimed, is metered: it is never claimed again."""
        async with self._db.session() as s:
            await s.execute(update(StoredResponse).where(StoredResponse.id == response_id).values(
                unsettled=null(), metering_until=None))
            await s.commit()

    async def unsettled(self, limit: int, after: str = "") -> list[tuple[str, dict[str, Any]]]:
        """Up to ``limit`` responses whose spend is not metered yet, nor being metered (claimed, the
        lease still running), in id order from after ``after``, with what their ``unsettled`` holds."""
        async with self._db.session() as s:
            rows = (await s.execute(select(StoredResponse.id, StoredResponse.unsettled).where(
                StoredResponse.unsettled.is_not(None), _unleased(time.time()), StoredResponse.id > after).order_by(
                StoredResponse.id).limit(limit))).all()
        return [(row[0], row[1]) for row in rows]

    async def withheld(self, principal: Principal, response_id: str) -> bool:
        """Whether ``response_id`` is stored for another owner, or was deleted: an id the caller must
        not reach through an upstream either (the upstream that answered it serves every tenant)."""
        async with self._db.session() as s:
            owner = (await s.execute(select(StoredResponse.owner).where(StoredResponse.id == response_id))).scalar()
        return owner is not None and owner != owner_of(principal)

    async def delete(self, principal: Principal, response_id: str) -> bool:
        """Forget the caller's response: its row left as a tombstone, owned by no one and emptied."""
        async with self._db.session() as s:
            result = await s.execute(update(StoredResponse).where(
                StoredResponse.id == response_id, StoredResponse.owner == owner_of(principal)).values(
                owner=DELETED, model="", previous_response_id=None, upstream_previous_id=None, deployment=None,
                input_items=[], context=[], response={}))
            await s.commit()
        return bool(getattr(result, "rowcount", 0))


def _unleased(now: float) -> ColumnElement[bool]:
    """Rows no caller is metering: never claimed, or their lease ran out (the meterer died)."""
    return or_(StoredResponse.metering_until.is_(None), StoredResponse.metering_until < now)
