"""What a caller may use: the limits of its key and of its tenant, read from SQL and cached.

A rotated key continues the key it replaced (``ApiKey.rotated_from``): a key's scope is counted
under the first key of its rotation chain, so the old key in its grace period and every key
rotated from it share one set of counters (rates, concurrency and budgets, in the store), and a
budget rebuilt from the usage records sums the spend of the whole chain. Each key keeps its own
limits (rotation copies them).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import and_, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from gateway.caching import RefreshingCache
from gateway.contracts import Principal
from gateway.db.engine import Database
from gateway.db.models import ApiKey, Limit, UsageHourly, UsageRow

Period = Literal["day", "month", "total"]
WINDOW_SECONDS = 60  # requests/min and tokens/min are sliding windows of one-second buckets
MAX_CHAIN = 10_000  # rotations followed at most (a guard: a chain cannot loop)


@dataclass(frozen=True)
class Limits:
    """None means "no limit" for that dimension."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None  # USD
    budget_period: Period = "month"

    @classmethod
    def from_row(cls, row: Limit) -> Limits:
        return cls(
            requests_per_minute=row.requests_per_minute,
            tokens_per_minute=row.tokens_per_minute,
            max_concurrency=row.max_concurrency,
            token_budget=row.token_budget,
            cost_budget=row.cost_budget,
            budget_period=row.budget_period,  # type: ignore[arg-type]
        )

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Scope:
    """One counted subject: ``kind`` is "key" or "tenant"."""

    kind: str
    id: str
    limits: Limits

    @property
    def label(self) -> str:
        return f"{self.kind} {self.id}"


def _bucket(period: Period, now: float) -> tuple[float, float, str]:
    """(start, end, id) of the day or month holding ``now``."""
    t = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = datetime(t.year, t.month, t.day, tzinfo=UTC).timestamp()
        return start, start + 86400, t.strftime("d%Y%m%d")
    start = datetime(t.year, t.month, 1, tzinfo=UTC).timestamp()
    return start, start + calendar.monthrange(t.year, t.month)[1] * 86400, t.strftime("m%Y%m")


_current: dict[str, tuple[float, float, str]] = {}  # period -> the bucket last asked for (hot path)


def period_id(period: Period, now: float) -> tuple[str, int]:
    """The budget bucket for ``now`` and how many seconds until it ends (0: never)."""
    if period == "total":
        return "total", 0
    bucket = _current.get(period)
    if bucket is None or not bucket[0] <= now < bucket[1]:
        bucket = _current[period] = _bucket(period, now)
    return bucket[2], max(1, int(bucket[1] - now) + 1)


def period_start(period: Period, now: float) -> float | None:
    """When the budget bucket for ``now`` began (None: the "total" bucket has no start)."""
    return None if period == "total" else _bucket(period, now)[0]


async def chain_root(session: AsyncSession, key_id: str) -> str:
    """The first key of ``key_id``'s rotation chain (``key_id`` itself for a key never rotated)."""
    up = select(ApiKey.id, ApiKey.rotated_from, literal(0).label("depth")).where(ApiKey.id == key_id).cte(
        "up", recursive=True)
    up = up.union_all(select(ApiKey.id, ApiKey.rotated_from, up.c.depth + 1)
                      .where(ApiKey.id == up.c.rotated_from, up.c.depth < MAX_CHAIN))
    root = await session.scalar(select(up.c.id).order_by(up.c.depth.desc()).limit(1))
    return root or key_id


def key_chain(root: str) -> Any:
    """The ids of ``root`` and of every key rotated from it, directly or not (a subquery)."""
    down = select(ApiKey.id, literal(0).label("depth")).where(ApiKey.id == root).cte("down", recursive=True)
    down = down.union_all(select(ApiKey.id, down.c.depth + 1)
                          .where(ApiKey.rotated_from == down.c.id, down.c.depth < MAX_CHAIN))
    return select(down.c.id)


def tokens_of(table: type[UsageRow] | type[UsageHourly]) -> ColumnElement[int]:
    """The prompt and completion tokens of ``table``'s rows, summed each on its own: a row's two
    counts may add up past what their column holds, which PostgreSQL's addition refuses (its SUM of
    BIGINTs is a NUMERIC)."""
    return (func.coalesce(func.sum(table.prompt_tokens), 0)
            + func.coalesce(func.sum(table.completion_tokens), 0))


def spent_rows(scope: Scope, now: float, chain: Any | None = None) -> list[ColumnElement[bool]]:
    """The usage records a budget of ``scope`` counts in its current budget period (a key's scope:
    every key of its rotation chain; ``chain``: ``key_chain`` of it, where a statement names it more
    than once)."""
    if scope.kind == "key":
        whose = or_(UsageRow.key_id == scope.id,
                    UsageRow.key_id.in_(chain if chain is not None else key_chain(scope.id)))
    else:
        whose = UsageRow.tenant_id == scope.id
    start = period_start(scope.limits.budget_period, now)
    return [whose] if start is None else [whose, UsageRow.started_at >= datetime.fromtimestamp(start, UTC)]


class LimitsSource:
    """Limits for a principal's key and tenant, cached for ``ttl`` seconds (changes apply within it).

    While the database is unreachable, cached limits up to ``stale_grace`` seconds old are used.
    """

    def __init__(self, db: Database, *, ttl: float = 2.0, stale_grace: float = 300.0) -> None:
        self.db = db
        self._cache: RefreshingCache[tuple[str, str | None], list[Scope]] = RefreshingCache(
            ttl, stale_grace=stale_grace, max_entries=50_000, name="limits")

    async def scopes(self, principal: Principal) -> list[Scope]:
        return await self._cache.get((principal.key_id, principal.tenant_id), lambda: self._load(principal))

    async def _load(self, principal: Principal) -> list[Scope]:
        wanted = [and_(Limit.scope == "key", Limit.scope_id == principal.key_id)]
        if principal.tenant_id is not None:
            wanted.append(and_(Limit.scope == "tenant", Limit.scope_id == principal.tenant_id))
        async with self.db.session() as session:
            rows = (await session.scalars(select(Limit).where(or_(*wanted)))).all()
            root = await chain_root(session, principal.key_id)
        found = {(r.scope, r.scope_id): Limits.from_row(r) for r in rows}
        scopes = [Scope("key", root, found.get(("key", principal.key_id), Limits()))]
        if principal.tenant_id is not None:
            tid = principal.tenant_id
            scopes.append(Scope("tenant", tid, found.get(("tenant", tid), Limits())))
        return scopes

    def invalidate(self) -> None:
        self._cache.clear()
