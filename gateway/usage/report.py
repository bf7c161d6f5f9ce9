"""Usage reports: usage_records aggregated by tenant, key, model and/or day over a date range."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.elements import ColumnElement

from gateway.db.engine import Database
from gateway.db.models import UsageRow
from gateway.errors import ParameterError
from gateway.usage.records import plain_cost

GROUPS = ("tenant", "key", "model", "day")


@dataclass(frozen=True)
class ReportQuery:
    start: datetime | None = None  # inclusive
    end: datetime | None = None  # exclusive
    group_by: tuple[str, ...] = ("tenant", "model", "day")
    tenant_id: str | None = None
    key_id: str | None = None


def parse_day(text: str, param: str) -> datetime:
    """``YYYY-MM-DD`` or an ISO timestamp, as UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ParameterError(f"{param} must be a date (YYYY-MM-DD) or ISO timestamp, got {text!r}",
                             param=param) from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:  # an offset that moves 0001-01-01 or 9999-12-31 out of range in UTC is refused, not a 500
        return value.astimezone(UTC)
    except OverflowError:
        raise ParameterError(f"{param} must lie between 0001-01-01 and 9999-12-31 in UTC, got {text!r}",
                             param=param) from None


def end_of_day(text: str, param: str) -> datetime:
    """An end bound: a bare date, in any form ``date.fromisoformat`` reads (``2026-01-31``,
    ``20260131``), includes that whole day (9999-12-31 up to the last representable instant)."""
    value = parse_day(text, param)
    try:
        date.fromisoformat(text.strip())
    except ValueError:  # a time of day: the bound itself
        return value
    try:
        return value + timedelta(days=1)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


def _day(dialect: str) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", UsageRow.started_at), "YYYY-MM-DD")
    return func.strftime("%Y-%m-%d", UsageRow.started_at)


MEASURES = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens", "cost")


def report_columns(group_by: tuple[str, ...]) -> list[str]:
    """A report row's keys, in order: its groups, then ``MEASURES`` (a CSV header with no rows too)."""
    return [*group_by, *MEASURES]


async def usage_report(db: Database, q: ReportQuery) -> list[dict[str, Any]]:
    unknown = [g for g in q.group_by if g not in GROUPS]
    if unknown:
        raise ParameterError(f"cannot group by {unknown[0]!r}; choose from {', '.join(GROUPS)}", param="group_by")
    columns: dict[str, ColumnElement[Any] | InstrumentedAttribute[Any]] = {
        "tenant": UsageRow.tenant_id,
        "key": UsageRow.key_id,
        "model": UsageRow.model,
        "day": _day(db.dialect),
    }
    groups = [columns[g].label(g) for g in q.group_by]
    query = select(
        *groups,
        func.count().label("requests"),
        func.sum(case((UsageRow.status >= 400, 1), else_=0)).label("errors"),
        func.sum(UsageRow.prompt_tokens).label("prompt_tokens"),
        func.sum(UsageRow.completion_tokens).label("completion_tokens"),
        func.sum(UsageRow.cached_tokens).label("cached_tokens"),
        func.sum(UsageRow.cost).label("cost"),
    )
    if q.start is not None:
        query = query.where(UsageRow.started_at >= q.start)
    if q.end is not None:
        query = query.where(UsageRow.started_at < q.end)
    if q.tenant_id is not None:
        query = query.where(UsageRow.tenant_id == q.tenant_id)
    if q.key_id is not None:
        query = query.where(UsageRow.key_id == q.key_id)
    if groups:
        query = query.group_by(*groups).order_by(*groups)
    async with db.session() as s:
        rows = (await s.execute(query)).mappings().all()
    out = []
    for row in rows:
        item = {g: row[g] for g in q.group_by}
        item["requests"] = int(row["requests"] or 0)
        item["errors"] = int(row["errors"] or 0)
        for field in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            item[field] = int(row[field] or 0)
        item["total_tokens"] = item["prompt_tokens"] + item["completion_tokens"]
        item["cost"] = plain_cost(row["cost"])  # the rows' sum, as the export shows each row
        out.append(item)
    return out
