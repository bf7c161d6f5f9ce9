"""Admin commands on the database (same settings as the server): tenants, keys, limits, usage.

Every command prints a rich table, or JSON with ``--json``; new keys are printed exactly once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import typer
from sqlalchemy.exc import SQLAlchemyError

from gateway.admin.bootstrap import bootstrap as run_bootstrap
from gateway.admin.service import (
    BUDGET_PERIODS,
    LIMIT_MAX,
    MAX_SECONDS,
    MIN_KEY_SECONDS,
    AdminError,
    TenancyService,
    bound,
)
from gateway.cli.db import ConfigOpt, console, err, fail, safe, settings_from
from gateway.cli.errors import debugging, explain
from gateway.cli.output import plain, print_secret, show, show_one
from gateway.db.engine import Database
from gateway.db.migrate import SchemaNotReady, check_schema
from gateway.quotas.limits import Limits

T = TypeVar("T")
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

tenant_app = typer.Typer(no_args_is_help=True, help="Tenants.")
key_app = typer.Typer(no_args_is_help=True, help="API keys.")
limits_app = typer.Typer(no_args_is_help=True, help="Quotas for a tenant or a key.")


def run(config: Any, job: Callable[[TenancyService, Database], Awaitable[T]]) -> T:
    url = settings_from(config).database.url

    async def go() -> T:
        db = Database.from_url(url)
        try:
            await check_schema(db.engine)
            return await job(TenancyService(db), db)
        finally:
            await db.dispose()

    try:
        return asyncio.run(go())
    except BrokenPipeError:  # `usage export | head` has exited: Click ends quietly, as for any command's output
        raise
    except (AdminError, SchemaNotReady, ValueError, OverflowError, SQLAlchemyError, OSError) as exc:
        if debugging():
            raise
        fail(explain(exc, url))  # no database, refused, not migrated, unknown tenant: one line, with the fix
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- tenants

TENANT_COLUMNS = ["id", "name", "status", "weight", "created_at"]


@tenant_app.command("create")
def tenant_create(name: str, weight: float = 1.0, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Create a tenant."""
    show_one(run(config, lambda svc, _: svc.create_tenant(name, weight=weight)), as_json)


@tenant_app.command("list")
def tenant_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List tenants."""
    show([asdict(t) for t in run(config, lambda svc, _: svc.list_tenants()).items], as_json, TENANT_COLUMNS,
         empty="no tenants yet: create one with `switchyard tenant create NAME`")


@tenant_app.command("show")
def tenant_show(tenant: str, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Show a tenant (by id or name), its keys and limits."""

    async def job(svc: TenancyService, _: Database) -> dict[str, Any]:
        t = await svc.get_tenant(tenant)
        keys = (await svc.list_keys(t.id)).items
        return {
            **asdict(t),
            "limits": (await svc.get_limits("tenant", t.id)).as_dict(),
            "keys": [asdict(k) for k in keys],
        }

    data = run(config, job)
    if as_json:
        typer.echo(json.dumps(plain(data), indent=2))
        return
    show_one({k: v for k, v in data.items() if k not in ("keys", "limits")}, False)
    console.print("limits:")
    show_one(data["limits"], False)
    show(data["keys"], False, KEY_TABLE, title="keys")


@tenant_app.command("disable")
def tenant_disable(tenant: str, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Disable a tenant: all its keys stop working (within the key cache time)."""
    show_one(run(config, lambda svc, _: svc.update_tenant(tenant, status="disabled")), as_json)


@tenant_app.command("enable")
def tenant_enable(tenant: str, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Re-enable a disabled tenant."""
    show_one(run(config, lambda svc, _: svc.update_tenant(tenant, status="active")), as_json)


# ---------------------------------------------------------------- keys

# what a table shows (80 columns); --json gives every field
KEY_TABLE = ["id", "name", "prefix", "status", "expires_at"]
KEY_TABLE_ALL = ["id", "tenant_id", "name", "status", "expires_at"]


@key_app.command("create")
def key_create(
    tenant: Annotated[str | None, typer.Option(help="Tenant id or name.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="An admin key (no tenant).")] = False,
    name: str = "",
    model: Annotated[
        list[str] | None, typer.Option("--model", help="Allowed model (repeatable; default: all).")
    ] = None,
    expires_in_days: Annotated[float | None, typer.Option(help="Expire after this many days.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key for a tenant (or --admin); the key is printed once."""
    expires = None
    if expires_in_days is not None:
        if not MIN_KEY_SECONDS / 86400 <= expires_in_days <= MAX_SECONDS / 86400:
            fail(
                f"--expires-in-days must lie in [{MIN_KEY_SECONDS / 86400:.3g} ({MIN_KEY_SECONDS} s), "
                f"{MAX_SECONDS // 86400}], got {expires_in_days!r}: a key that expires sooner has expired "
                "before it can be used"
            )
        expires = datetime.now(UTC) + timedelta(days=expires_in_days)
    created = run(
        config, lambda svc, _: svc.create_key(tenant, name=name, models=model, expires_at=expires, admin=admin)
    )
    print_secret(created.secret, as_json, asdict(created.key))


@key_app.command("list")
def key_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (prefixes only; secrets are never stored)."""
    keys = [asdict(k) for k in run(config, lambda svc, _: svc.list_keys(tenant)).items]
    show(keys, as_json, KEY_TABLE if tenant else KEY_TABLE_ALL, empty="no keys")


@key_app.command("revoke")
def key_revoke(key_id: str, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Revoke a key (rejected everywhere within the key cache time, at most 5 s)."""
    show_one(run(config, lambda svc, _: svc.revoke_key(key_id)), as_json)


@key_app.command("rotate")
def key_rotate(
    key_id: str,
    grace_hours: Annotated[float, typer.Option(help="How long the old key keeps working.")] = 24.0,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a key: a new key (printed once) with the same tenant, models and limits."""
    if not 0 <= grace_hours <= MAX_SECONDS / 3600:
        fail(f"--grace-hours must lie in [0, {MAX_SECONDS // 3600}], got {grace_hours!r}")
    created = run(config, lambda svc, _: svc.rotate_key(key_id, grace_seconds=grace_hours * 3600))
    print_secret(created.secret, as_json, asdict(created.key))


# ---------------------------------------------------------------- limits


def _scope(tenant: str | None, key: str | None) -> tuple[str, str]:
    if (tenant is None) == (key is None):
        fail("give exactly one of --tenant or --key")
    return ("tenant", tenant) if tenant is not None else ("key", key)  # type: ignore[return-value]


NONE_HELP = "(-1 removes the limit)"


@limits_app.command("set")
def limits_set(
    tenant: Annotated[str | None, typer.Option(help="Tenant id or name.")] = None,
    key: Annotated[str | None, typer.Option(help="Key id.")] = None,
    rpm: Annotated[int | None, typer.Option(help=f"Requests per minute {NONE_HELP}.")] = None,
    tpm: Annotated[int | None, typer.Option(help=f"Tokens per minute {NONE_HELP}.")] = None,
    concurrency: Annotated[int | None, typer.Option(help=f"Concurrent requests {NONE_HELP}.")] = None,
    token_budget: Annotated[int | None, typer.Option(help=f"Tokens per budget period {NONE_HELP}.")] = None,
    cost_budget: Annotated[float | None, typer.Option(help=f"USD per budget period {NONE_HELP}.")] = None,
    period: Annotated[str | None, typer.Option(help="Budget period: day, month or total.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change the given limits of a tenant or key; the others stay as they are."""
    scope, ref = _scope(tenant, key)
    given = {
        ("requests_per_minute", "--rpm"): rpm,
        ("tokens_per_minute", "--tpm"): tpm,
        ("max_concurrency", "--concurrency"): concurrency,
        ("token_budget", "--token-budget"): token_budget,
        ("cost_budget", "--cost-budget"): cost_budget,
    }
    changes: dict[str, Any] = {}
    for (field, option), value in given.items():
        if value is None:
            continue
        if value != -1 and not 0 <= value <= LIMIT_MAX[field]:  # -5 is a typo, not a removal; NaN fails too
            fail(f"{option} must be -1 (no limit) or lie in [0, {bound(LIMIT_MAX[field])}], got {value!r}")
        changes[field] = None if value == -1 else value
    if period is not None:
        if period not in BUDGET_PERIODS:
            fail(f"--period must be {', '.join(BUDGET_PERIODS[:-1])} or {BUDGET_PERIODS[-1]}, got {period!r}")
        changes["budget_period"] = period
    if not changes:
        fail(f"give a limit to change: {', '.join(option for _, option in given)} or --period")
    limits = run(config, lambda svc, _: svc.update_limits(scope, ref, **changes))
    show_one(limits.as_dict(), as_json)


@limits_app.command("show")
def limits_show(
    tenant: Annotated[str | None, typer.Option(help="Tenant id or name.")] = None,
    key: Annotated[str | None, typer.Option(help="Key id.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the limits of a tenant or key (empty: unlimited)."""
    scope, ref = _scope(tenant, key)
    limits: Limits = run(config, lambda svc, _: svc.get_limits(scope, ref))
    show_one(limits.as_dict(), as_json)


# ---------------------------------------------------------------- bootstrap


def bootstrap(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Migrate the database; on first run create tenant "default" and print its key once."""
    url = settings_from(config).database.url
    try:
        result = asyncio.run(run_bootstrap(url, progress=lambda line: err.print(f"  {safe(line)}")))
    except Exception as exc:
        if debugging():
            raise
        fail(f"bootstrap failed: {explain(exc, url)}")
    if as_json:
        typer.echo(json.dumps(asdict(result), indent=2))
    elif result.created:
        typer.echo(f"Created tenant 'default' ({result.tenant_id}) and key {result.key_id}.")
        typer.echo(f"API key (shown once, store it now):\n{result.secret}")
    else:
        console.print("database is migrated; tenant keys already exist (nothing created)")


def register(app: typer.Typer) -> None:
    app.add_typer(tenant_app, name="tenant")
    app.add_typer(key_app, name="key")
    app.add_typer(limits_app, name="limits")
    app.command("bootstrap")(bootstrap)
