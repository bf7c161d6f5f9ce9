"""What a budget bucket is rebuilt from: the spend the usage records show for its scope in its
period, and the charges still to come that those records already hold.

A background response's meterer (``gateway.held_usage``) records its usage row, then charges the
budgets under the row's id (``once``), then settles its stored row. A bucket rebuilt in between
(Redis restarted empty, a budget set meanwhile) holds the row; its charge, when it comes, must add
nothing to it. So the rebuild reads, with the spend, the ids of the usage rows it counted among the
background responses of its scope whose metering is not settled yet (the stored rows still
``unsettled``, few, found through their partial index; their usage rows by their unique
``request_id``), and the store notes them in the bucket in the same atomic step as it writes it
(``QuotaStore.seed_budget``): a charge under one of them adds nothing to that bucket (and only to
that one: the key's bucket rebuilt and the tenant's not, the tenant's is charged).

The spend and the rows counted are one statement's reading, one snapshot in PostgreSQL and SQLite
alike: a row is noted only if the spend holds it. The ids it looks for are those of the responses
unsettled at the previous reading (none at the first): a response that became unsettled in between
(started, ended and recorded within one round trip) is looked for in one more reading, until the
responses read unsettled are all looked for (``TRIES``; past that, one left out would be counted
twice, as before). The reading comes before the store's step, and a charge may run in between:
it finds no bucket (it adds nothing) and notes its once-key, so the store notes nothing for it, and
the spend holds its row. A usage row still on its way (another replica's writer buffer, a database
outage) is not in the spend and not noted: its charge, when it comes after the rebuild, counts it
(one that ran while the bucket was missing added nothing: such a row is missed, as any record on
its way is, ``admission.py``). A response settled by then had its charge made before (the meterer
charges before it settles): nothing of it is noted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, String, func, literal, or_, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from gateway.db.engine import Database
from gateway.db.models import StoredResponse, UsageRow
from gateway.quotas.limits import Scope, key_chain, spent_rows, tokens_of
from gateway.stored_responses import usage_id

TRIES = 5  # readings at most, each looking for the responses the one before found unsettled


@dataclass(frozen=True)
class Recorded:
    """A scope's spend in its budget period, as its usage records show it, and the once-keys of the
    charges to come that it holds (see the module's docstring)."""

    tokens: int
    picos: int
    counted: list[str]


async def recorded_spend(db: Database, scope: Scope, now: float) -> Recorded:
    """Tokens and pico-dollars the usage records show for ``scope`` in its current budget period (a
    key's scope: every key of its rotation chain), and the once-keys of the charges to come they hold."""
    looked_for: set[str] = set()  # response ids
    for _ in range(TRIES):
        async with db.session() as session:
            rows = (await session.execute(_reading(scope, now, sorted(map(usage_id, looked_for))))).all()
        tokens, cost = next((r[2], r[3]) for r in rows if r[0] == "spend")
        unsettled = {str(r[1]) for r in rows if r[0] == "unsettled"}
        counted = {str(r[1]) for r in rows if r[0] == "counted"}
        if unsettled <= looked_for:
            break
        looked_for |= unsettled
    return Recorded(int(tokens), round(float(cost) * 1e12), sorted(counted & {usage_id(r) for r in unsettled}))


def _reading(scope: Scope, now: float, usage_ids: list[str]) -> Any:
    """One statement: ("spend", None, tokens, cost); then ("unsettled", id) for each background
    response of ``scope`` not metered yet; then ("counted", usage row id) for each usage row among
    ``usage_ids`` that the spend holds."""
    chain = key_chain(scope.id) if scope.kind == "key" else None  # named once, as the statement reuses it
    counted = spent_rows(scope, now, chain)
    spend = select(literal("spend", String), literal(None, String), tokens_of(UsageRow),
                   func.coalesce(func.sum(UsageRow.cost), 0.0)).where(*counted)
    pending = select(literal("unsettled", String), StoredResponse.id, literal(0), literal(0.0, Float)).where(
        StoredResponse.unsettled.is_not(None), _started_by(scope, chain))
    parts = [spend, pending]
    if usage_ids:
        parts.append(select(literal("counted", String), UsageRow.request_id, literal(0), literal(0.0, Float))
                     .where(*counted, UsageRow.request_id.in_(usage_ids)))
    return union_all(*parts)


def _started_by(scope: Scope, chain: Any) -> ColumnElement[bool]:
    """Stored responses whose spend ``scope`` is charged (``held_usage.unsettled`` names who started it)."""
    if scope.kind == "key":
        key = StoredResponse.unsettled["key_id"].as_string()
        return or_(key == scope.id, key.in_(chain))
    return StoredResponse.unsettled["tenant_id"].as_string() == scope.id
