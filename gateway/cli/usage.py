"""``switchyard usage report|export``: usage summed by tenant / key / model / day, or every request
of a range as CSV (with a progress line on stderr while it runs)."""

from __future__ import annotations

import csv
import io
import re
import sys
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Annotated, Any, TextIO

import typer

from gateway.admin.service import TenancyService
from gateway.cli.admin import JsonOpt, run
from gateway.cli.db import ConfigOpt, console, fail
from gateway.cli.output import cell, show
from gateway.db.engine import Database
from gateway.errors import ParameterError
from gateway.usage import records
from gateway.usage.report import ReportQuery, end_of_day, parse_day, report_columns, usage_report

usage_app = typer.Typer(no_args_is_help=True, help="Usage reports and exports.")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([mhdw])")

StartOpt = Annotated[str | None, typer.Option(help="From this day (YYYY-MM-DD, UTC) or ISO timestamp, inclusive.")]
EndOpt = Annotated[str | None, typer.Option(help="To this day, inclusive (default: now).")]
SinceOpt = Annotated[str | None, typer.Option(help="Instead of --start: this long ago, e.g. 90m, 24h, 7d, 2w.")]
TenantOpt = Annotated[str | None, typer.Option(help="Only this tenant (id or name).")]
KeyOpt = Annotated[str | None, typer.Option(help="Only this key id.")]


def parse_duration(text: str, param: str = "--since") -> timedelta:
    """``90m``, ``24h``, ``7d``, ``2w``; anything else ends the command with one line saying so."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or float(match.group(1)) <= 0:
        fail(f"{param}: {text!r} is not a duration; give a positive number with m, h, d or w, e.g. 90m, 24h, 7d")
    assert match is not None
    try:
        return timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    except OverflowError:
        fail(f"{param}: {text!r} is too long")
        raise


def _bounds(start: str | None, end: str | None, since: str | None) -> tuple[datetime | None, datetime | None]:
    if since and start:
        fail("give --start or --since, not both")
    try:
        hi = end_of_day(end, "end") if end else None
        lo = parse_day(start, "start") if start else None
    except ParameterError as exc:
        fail(exc.message)
        raise
    if since:
        try:
            return (hi or datetime.now(UTC)) - parse_duration(since), hi
        except OverflowError:
            fail(f"--since: {since!r} reaches before the year 1")
    if lo is not None and hi is not None and lo >= hi:
        fail("--start must be before --end")
    return lo, hi


async def _filters(svc: TenancyService, tenant: str | None, key: str | None) -> str | None:
    """The id of the tenant ``--tenant`` names; an unknown tenant or ``--key`` is an error, not an empty
    range, and an empty one (an unset shell variable) too, not every tenant's usage."""
    if key is not None:
        await svc.check_key_filter(key)
    return (await svc.get_tenant(tenant)).id if tenant is not None else None


@usage_app.command("report")
def usage_report_cmd(
    start: StartOpt = None,
    end: EndOpt = None,
    since: SinceOpt = None,
    by: Annotated[str, typer.Option(help="Group by: comma-separated tenant,key,model,day.")] = "tenant,model,day",
    tenant: TenantOpt = None,
    key: KeyOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Requests, tokens and cost from the usage records."""
    if fmt not in ("table", "csv", "json"):
        fail("--format must be table, csv or json")
    lo, hi = _bounds(start, end, since)
    groups = tuple(dict.fromkeys(g.strip() for g in by.split(",") if g.strip()))  # a group named twice: one column

    async def job(svc: TenancyService, db: Database) -> list[dict[str, Any]]:
        tenant_id = await _filters(svc, tenant, key)
        q = ReportQuery(start=lo, end=hi, group_by=groups, tenant_id=tenant_id, key_id=key)
        return await usage_report(db, q)

    rows = run(config, job)
    if as_json or fmt == "json":
        show(rows, True)
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=report_columns(groups))  # the header also with no rows
        writer.writeheader()
        writer.writerows({k: cell(records.sheet_cell(v)) for k, v in r.items()} for r in rows)
        typer.echo(out.getvalue(), nl=False)
    elif rows:
        show(rows, False)
    else:
        console.print("no usage in that range")


class Progress:
    """One status line on stderr: rewritten in place on a terminal, a line per step otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def update(self, text: str) -> None:
        sys.stderr.write(f"\r{text}\033[K" if self.tty else f"{text}\n")
        sys.stderr.flush()

    def done(self, text: str) -> None:
        sys.stderr.write(f"\r{text}\033[K\n" if self.tty else f"{text}\n")


def _open_output(output: Path | None) -> IO[str] | nullcontext[TextIO]:
    """``--output`` opened to write (stdout without one); a path it cannot write is one line naming it."""
    if output is None:
        return nullcontext(sys.stdout)
    try:
        return output.open("w", encoding="utf-8", newline="")
    except OSError as exc:
        raise ValueError(f"cannot write {output}: {exc.strerror or exc}") from None


@usage_app.command("export")
def usage_export(
    start: StartOpt = None,
    end: EndOpt = None,
    since: SinceOpt = None,
    tenant: TenantOpt = None,
    key: KeyOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the CSV here (default: stdout).")] = None,
    config: ConfigOpt = None,
) -> None:
    """Every request of the range as CSV (time, tenant, key, model, deployment, status, tokens, cost,
    latency, error, the provider's request id), oldest first; default range: the last 30 days."""
    lo, hi = _bounds(start, end, since)
    now = datetime.now(UTC)
    hi = hi or now + timedelta(seconds=1)
    try:
        lo = lo or hi - timedelta(days=30)
    except OverflowError:
        fail(f"--end: the default range, 30 days before {end}, reaches before the year 1; give --start too")
        raise
    if lo >= hi:  # a --start after the default end (now)
        fail("--start must be before --end")
    progress = Progress()

    async def job(svc: TenancyService, db: Database) -> int:
        tenant_id = await _filters(svc, tenant, key)
        f = records.RecordFilter(tenant_id, lo, hi, key_id=key, operator=True)
        # the file is opened once the database and the tenant are known: a typo leaves it as it was
        with _open_output(output) as target:
            target.write(records.csv_text([], header=True, operator=True))
            n = 0
            async for batch in records.batches(db, f):
                target.write(records.csv_text(batch, operator=True))
                n += len(batch)
                progress.update(f"exporting: {n:,} requests (up to {batch[-1]['started_at'][:19]})")
        return n

    n = run(config, job)
    where = f" to {output}" if output else ""
    progress.done(f"exported {n:,} requests from {lo:%Y-%m-%d %H:%M} to {hi:%Y-%m-%d %H:%M} UTC{where}")


def register(app: typer.Typer) -> None:
    app.add_typer(usage_app, name="usage")
