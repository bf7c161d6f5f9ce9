"""``switchyard audit list``: the authentication audit trail (sign-ins, sign-outs, failed attempts,
key use: who, when, from where), newest first, as a table or JSON."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gateway.admin.service import AdminError, TenancyService
from gateway.auth.audit import EVENTS, list_events
from gateway.cli.admin import JsonOpt, run
from gateway.cli.db import ConfigOpt
from gateway.cli.output import show
from gateway.db.engine import Database
from gateway.usage.report import parse_day

audit_app = typer.Typer(no_args_is_help=True, help="The authentication audit trail.")
COLUMNS = ["at", "event", "surface", "client", "key_id", "tenant_id", "key_prefix"]


@audit_app.command("list")
def audit_list(
    event: Annotated[str | None, typer.Option(help=f"Only this event: {', '.join(EVENTS)}.")] = None,
    key: Annotated[str | None, typer.Option(help="Only this key id.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant (id or name).")] = None,
    client: Annotated[str | None, typer.Option(help="Only this client address.")] = None,
    since: Annotated[str | None, typer.Option(help="From this day or ISO time (UTC) on.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many events.")] = 100,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Sign-ins, sign-outs, failed attempts and key use, newest first."""

    async def job(svc: TenancyService, db: Database) -> list[dict[str, Any]]:
        if event is not None and event not in EVENTS:
            raise AdminError(f"--event must be one of {', '.join(EVENTS)}")
        if key is not None:
            await svc.check_key_filter(key)
        tenant_id = (await svc.get_tenant(tenant)).id if tenant is not None else None  # "": not every tenant
        start = parse_day(since, "since") if since else None
        return await list_events(db, event=event, key_id=key, tenant_id=tenant_id, client=client, since=start,
                                 limit=limit)

    show(run(config, job), as_json, COLUMNS)
