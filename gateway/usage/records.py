"""Single usage records: the request log's search and detail, and the CSV export of a range.

Every CSV the gateway writes goes through ``csv_table``: a text cell that a spreadsheet would read
as a formula (it begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return: a key's name, a
model or service tier an upstream named) is written with a leading ``'``, as OWASP recommends;
numbers are written in plain decimal notation (``0.00000165``, never ``1.65e-06``), which every
spreadsheet locale reads.

Every query is scoped by ``RecordFilter.tenant_id`` when it is set (the dashboard always sets it
to the caller's own tenant); the CLI's export may leave it empty to export all tenants. The
operator's views (``RecordFilter.operator``: the CLI's export, an admin's dashboard) add the
provider's own request id (``upstream_request_id``), which identifies the operator's provider
account's traffic and is never shown to a tenant.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, and_, func, or_, select

from gateway.db.engine import Database
from gateway.db.models import UsageRow
from gateway.errors import ParameterError

COLUMNS = ("request_id", "started_at", "tenant_id", "key_id", "model", "deployment", "provider", "endpoint",
           "stream", "status", "error_type", "prompt_tokens", "completion_tokens", "cached_tokens", "exact",
           "cost", "latency_ms", "ttft_ms", "service_tier")
OPERATOR_COLUMNS = (*COLUMNS, "upstream_request_id")  # what the operator's views add to a tenant's
STATUSES = ("ok", "error", "429")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
MAX_PAGE = 500

# why a request failed, in words, for the error types the gateway records
WHY = {
    "rate_limit_exceeded": "Refused by the gateway: over a rate, concurrency or budget limit of the key or tenant.",
    "rate_limited": "The provider rate-limited the request (its 429), on every deployment tried.",
    "quota_unavailable": "Refused: the quota service (Redis) was unavailable.",
    "timeout": "The provider did not answer in time.",
    "unavailable": "No deployment could take the request (down, or its circuit open).",
    "invalid_request_error": "The provider rejected the request as invalid.",
    "context_length_exceeded": "The prompt plus max tokens exceed the model's context window.",
    "upstream_error": "The provider failed (a 5xx or a broken answer) on every deployment tried.",
    "upstream_auth": "The provider rejected the gateway's credentials for this deployment.",
    "client_disconnected": "The client went away before the answer was complete.",
    "request_failed": "The engine failed this one request while serving others.",
    "untranslatable_answer": "The provider's answer cannot be written in the client's API (a tool call's "
                             "arguments that are not a JSON object, for /v1/messages); its usage is recorded.",
    "model_not_found": "The provider does not know the model of any deployment tried (a configuration error).",
}


@dataclass(frozen=True)
class RecordFilter:
    tenant_id: str | None
    start: datetime
    end: datetime
    text: str = ""  # matches a request id prefix, or a model / key / deployment / error type exactly
    model: str | None = None
    key_id: str | None = None
    status: str | None = None  # ok | error | 429
    operator: bool = False  # the operator reads: rows carry ``OPERATOR_COLUMNS``

    def where(self, q: Select[Any]) -> Select[Any]:
        if self.status not in (None, "", *STATUSES):
            raise ParameterError(f"status must be one of {', '.join(STATUSES)}", param="status")
        q = q.where(UsageRow.started_at >= self.start, UsageRow.started_at < self.end)
        if self.tenant_id is not None:
            q = q.where(UsageRow.tenant_id == self.tenant_id)
        if self.model:
            q = q.where(UsageRow.model == self.model)
        if self.key_id:
            q = q.where(UsageRow.key_id == self.key_id)
        if self.status == "ok":
            q = q.where(UsageRow.status < 400)
        elif self.status == "error":
            q = q.where(UsageRow.status >= 400)
        elif self.status == "429":
            q = q.where(UsageRow.status == 429)
        text = self.text.strip()
        if text:
            escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            # SQLite's LIKE ignores ASCII case (PostgreSQL's does not): the substr keeps the prefix exact
            prefix = and_(UsageRow.request_id.like(escaped + "%", escape="\\"),
                          func.substr(UsageRow.request_id, 1, len(text)) == text)
            q = q.where(or_(prefix, UsageRow.model == text, UsageRow.key_id == text, UsageRow.deployment == text,
                            UsageRow.error_type == text))
        return q


def columns(operator: bool) -> tuple[str, ...]:
    """The columns of a record the operator (else a tenant) reads."""
    return OPERATOR_COLUMNS if operator else COLUMNS


def plain_cost(value: float | None) -> float:
    """A cost (or a sum of costs) to twelve significant digits: what the rows hold, without the binary
    noise of the arithmetic, and never rounded to a fixed number of decimals (a cheap model's request
    costs well under a millionth of a dollar)."""
    return float(f"{float(value or 0.0):.12g}")


def as_dict(row: UsageRow, operator: bool = False) -> dict[str, Any]:
    """A record's columns (``columns``); its cost to twelve significant digits, without the binary
    noise of its arithmetic (0.1 + 0.2 is 0.3, not 0.30000000000000004)."""
    out = {c: getattr(row, c) for c in columns(operator)}
    out["started_at"] = row.started_at.isoformat()
    out["cost"] = plain_cost(row.cost)
    out["total_tokens"] = row.prompt_tokens + row.completion_tokens
    return out


async def search(db: Database, f: RecordFilter, limit: int = 50, before: str | None = None
                 ) -> tuple[list[dict[str, Any]], str | None]:
    """The newest matching records first, and a cursor for the next (older) page, or None."""
    if not 1 <= limit <= MAX_PAGE:
        raise ParameterError(f"limit must lie in [1, {MAX_PAGE}]", param="limit")
    q = f.where(select(UsageRow))
    if before:
        at, row_id = _cursor(before)
        q = q.where(or_(UsageRow.started_at < at, and_(UsageRow.started_at == at, UsageRow.id < row_id)))
    async with db.session() as s:
        rows = (await s.execute(q.order_by(UsageRow.started_at.desc(), UsageRow.id.desc()).limit(limit + 1))
                ).scalars().all()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = f"{rows[-1].started_at.isoformat()}~{rows[-1].id}" if more and rows else None
    return [as_dict(r, f.operator) for r in rows], cursor


def _cursor(text: str) -> tuple[datetime, int]:
    """A ``next_before`` cursor; a forged one (a time that leaves the calendar in UTC, an id past
    64 bits) is refused like a malformed one, naming ``before``, before it reaches the database."""
    try:
        at, _, row_id = text.rpartition("~")
        when, ident = datetime.fromisoformat(at), int(row_id)
        when = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
        if not -(2**63) <= ident < 2**63:
            raise ValueError(row_id)
        return when, ident
    except (ValueError, OverflowError):
        raise ParameterError("before must be a cursor from a previous page (next_before)", param="before") from None


async def one(db: Database, tenant_id: str | None, request_id: str,
              operator: bool = False) -> dict[str, Any] | None:
    """One record with a sentence on why it failed; None when it is not this tenant's."""
    q = select(UsageRow).where(UsageRow.request_id == request_id)
    if tenant_id is not None:
        q = q.where(UsageRow.tenant_id == tenant_id)
    async with db.session() as s:
        row = (await s.execute(q)).scalar_one_or_none()
    if row is None:
        return None
    out = as_dict(row, operator)
    out["explanation"] = explain(row.status, row.error_type)
    return out


def explain(status: int, error_type: str | None) -> str:
    if status < 400 and not error_type:
        return "Answered."
    if error_type in WHY:
        return WHY[error_type]
    return f"Failed with HTTP {status}" + (f" ({error_type})." if error_type else ".")


async def batches(db: Database, f: RecordFilter, size: int = 5000) -> AsyncIterator[list[dict[str, Any]]]:
    """All matching records, oldest first, a batch at a time (keyset paging on (started_at, id),
    the order it returns: a row written late with an earlier time is neither skipped nor repeated)."""
    q = f.where(select(UsageRow)).order_by(UsageRow.started_at, UsageRow.id).limit(size)
    page = q
    while True:
        async with db.session() as s:
            rows = (await s.execute(page)).scalars().all()
        if not rows:
            return
        at, last = rows[-1].started_at, rows[-1].id
        page = q.where(or_(UsageRow.started_at > at, and_(UsageRow.started_at == at, UsageRow.id > last)))
        yield [as_dict(r, f.operator) for r in rows]


def sheet_cell(value: Any) -> Any:
    """A cell as a spreadsheet should read it: text that would start a formula gets a leading
    quote; a float in plain decimal notation, the digits of its shortest repr and no exponent;
    integers, booleans and other text are unchanged, None is empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_table(columns: Iterable[str], rows: Iterable[dict[str, Any]], header: bool = True) -> str:
    """``rows`` (dicts holding every column) as CSV, every cell through ``sheet_cell``; lines end
    in CRLF (RFC 4180), so that a cell holding a lone CR is quoted too."""
    columns = tuple(columns)
    out = io.StringIO()
    writer = csv.writer(out)
    if header:
        writer.writerow(columns)
    for r in rows:
        writer.writerow([sheet_cell(r[c]) for c in columns])
    return out.getvalue()


def csv_text(rows: Iterable[dict[str, Any]], header: bool = False, operator: bool = False) -> str:
    return csv_table(columns(operator), rows, header)
