"""The dashboard's data endpoints under ``/dashboard/api`` (session cookie; JSON or CSV).

Which tenant a request may see is decided here, once, by ``tenant_for``: a tenant's session sees
only its own tenant (asking for another is a 403, whatever the id); an admin's session names
the tenant it wants. Errors answer in the OpenAI shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.di import Provide
from litestar.response import Stream

from gateway.admin.service import AdminError, NotFound, TenancyService
from gateway.auth.authenticator import ADMIN_KEY_ID
from gateway.dashboard import operator, queries
from gateway.dashboard.ranges import Range
from gateway.dashboard.revocations import Revocations
from gateway.dashboard.sessions import SESSION_COOKIE, SessionData, Sessions
from gateway.db.engine import Database
from gateway.errors import ParameterError
from gateway.usage import records

_SUMS = ("requests", "errors", "rate_limited", "prompt_tokens", "completion_tokens", "total_tokens", "cost")
CSV_TABLES = {
    "series": ("t", *_SUMS),
    "by_model": ("model", *_SUMS, "latency_p50", "latency_p90", "latency_p99"),
    "by_key": ("key_id", "key_name", *_SUMS),
    "errors": ("error_type", "requests", "rate"),
}


class NotSignedIn(AdminError):
    status = 401
    type = "authentication_error"


class NotYours(AdminError):
    status = 403
    type = "permission_error"


async def session_of(request: Request[Any, Any, Any], sessions: Sessions, svc: TenancyService,
                     revocations: Revocations) -> SessionData:
    """The signed-in session. One signed out, or whose key was revoked or expired (or whose tenant
    was disabled) since sign-in, ends at once, on every replica: both are read from the database."""
    session = sessions.verify(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise NotSignedIn("Sign in at /dashboard/login first.")
    if await revocations.is_revoked(session):
        raise NotSignedIn("This session was signed out; sign in again.")
    if session.key_id == ADMIN_KEY_ID:  # the config's admin key has no row: the session's fingerprint is checked
        if not session.admin_key or session.admin_key != sessions.admin_fingerprint:
            raise NotSignedIn("The admin key of this session was changed in the config; sign in again.")
    else:
        try:
            active = (await svc.get_key(session.key_id)).status == "active"
            if active and session.tenant_id is not None:
                active = (await svc.get_tenant(session.tenant_id)).status == "active"
        except NotFound:
            active = False
        if not active:
            raise NotSignedIn("The key of this session is no longer valid; sign in again.")
    return session


async def tenant_for(session: SessionData, requested: str | None, svc: TenancyService) -> str:
    """The tenant this session may read: its own, or (admins) the one it names."""
    if not session.is_admin:
        if requested not in (None, "", session.tenant_id):
            raise NotYours("This session may only read its own tenant's usage.", param="tenant_id")
        return session.tenant_id  # type: ignore[return-value]
    if not requested:
        raise AdminError("Admins choose a tenant: pass tenant_id.", param="tenant_id")
    try:
        return (await svc.get_tenant(requested)).id
    except NotFound:
        raise NotFound(f"No tenant {requested!r}.", param="tenant_id") from None


def _range(start: str | None, end: str | None, bucket: str | None, preset: str | None = None,
           tz: str | None = None) -> Range:
    try:
        return Range.parse(start, end, bucket, preset=preset, tz=tz)
    except ParameterError as exc:
        raise AdminError(exc.message, param=exc.param) from None


def _filter(session: SessionData, tenant: str, rng: Range, q: str, model: str | None, key_id: str | None,
            status: str | None) -> records.RecordFilter:
    """The records ``session`` asked for; an admin's carry the operator's columns."""
    if status not in (None, "", *records.STATUSES):
        raise AdminError(f"status must be one of {', '.join(records.STATUSES)}", param="status")
    return records.RecordFilter(tenant, rng.start, rng.end, text=q[:200], model=model or None,
                                key_id=key_id or None, status=status or None, operator=session.is_admin)


def _csv(body: str | AsyncIterator[str], name: str) -> Response[Any]:
    headers = {"content-disposition": f'attachment; filename="{name}"'}
    if isinstance(body, str):
        return Response(body, media_type="text/csv", headers=headers)
    return Stream(body, media_type="text/csv", headers=headers)


class DashboardApi(Controller):
    path = "/api"
    include_in_schema = False
    dependencies = {"session": Provide(session_of)}

    @get("/me")
    async def me(self, sessions: Sessions, session: SessionData, svc: TenancyService) -> dict[str, Any]:
        role = "admin" if session.is_admin else "tenant"
        name = (await svc.get_tenant(session.tenant_id)).name if session.tenant_id else None
        return {"role": role, "tenant_id": session.tenant_id, "tenant_name": name, "key_id": session.key_id,
                "csrf": sessions.csrf(session)}

    @get("/summary")
    async def summary(
        self, session: SessionData, svc: TenancyService, db: Database, tenant_id: str | None = None,
        start: str | None = None, end: str | None = None, bucket: str | None = None,
        range: str | None = None, tz: str | None = None,
    ) -> dict[str, Any]:
        tenant = await tenant_for(session, tenant_id, svc)
        data = await queries.summary(db, tenant, _range(start, end, bucket, range, tz))
        return {**data, "tenant_name": (await svc.get_tenant(tenant)).name}

    @get("/requests")
    async def requests(
        self, session: SessionData, svc: TenancyService, db: Database, tenant_id: str | None = None,
        start: str | None = None, end: str | None = None, range: str | None = None,
        tz: str | None = None, q: str = "", model: str | None = None, key_id: str | None = None,
        status: str | None = None, limit: int = 50, before: str | None = None,
    ) -> dict[str, Any]:
        """A page of the tenant's request log, newest first, and the names of the tenant's keys (the
        log shows a key by its name even when the page has not loaded the usage view)."""
        tenant = await tenant_for(session, tenant_id, svc)
        f = _filter(session, tenant, _range(start, end, None, range, tz), q, model, key_id, status)
        try:
            rows, cursor = await records.search(db, f, limit, before)
        except ParameterError as exc:
            raise AdminError(exc.message, param=exc.param) from None
        names = {k.id: k.name for k in (await svc.list_keys(tenant)).items if k.name}
        return {"data": rows, "next_before": cursor, "key_names": names}

    @get("/requests/{request_id:str}")
    async def request_detail(self, session: SessionData, svc: TenancyService, db: Database, request_id: str,
                             tenant_id: str | None = None) -> dict[str, Any]:
        """One request; another tenant's is "not found", exactly like one that does not exist."""
        tenant = await tenant_for(session, tenant_id, svc)
        row = await records.one(db, tenant, request_id, session.is_admin)
        if row is None:
            raise NotFound(f"No request {request_id[:64]!r} in this tenant's usage.", param="request_id")
        return row

    @get("/overview")
    async def overview(
        self, session: SessionData, db: Database, start: str | None = None, end: str | None = None,
        bucket: str | None = None, range: str | None = None, tz: str | None = None,
    ) -> dict[str, Any]:
        """All tenants side by side, top spenders and budgets (admins only)."""
        if not session.is_admin:
            raise NotYours("Only admins see the operator's view.")
        return await operator.overview(db, _range(start, end, bucket, range, tz))

    @get("/limits")
    async def limits(self, session: SessionData, svc: TenancyService, db: Database,
                     tenant_id: str | None = None) -> dict[str, Any]:
        tenant = await tenant_for(session, tenant_id, svc)
        return await queries.live(db, tenant, await svc.get_limits("tenant", tenant))

    @get("/export.csv")
    async def export(
        self, session: SessionData, svc: TenancyService, db: Database, tenant_id: str | None = None,
        start: str | None = None, end: str | None = None, bucket: str | None = None, table: str = "series",
        range: str | None = None, tz: str | None = None, q: str = "",
        model: str | None = None, key_id: str | None = None, status: str | None = None,
    ) -> Response[Any]:
        """A summary table, or (``table=requests``) every request of the range, as CSV."""
        if table not in (*CSV_TABLES, "requests"):
            raise AdminError(f"table must be one of {', '.join(CSV_TABLES)}, requests", param="table")
        tenant = await tenant_for(session, tenant_id, svc)
        rng = _range(start, end, bucket, range, tz)
        if table == "requests":
            f = _filter(session, tenant, rng, q, model, key_id, status)
            batches = records.batches(db, f)
            try:  # the query runs (and any error answers) before the 200 and the CSV start
                first = await anext(batches, None)
            except ParameterError as exc:
                raise AdminError(exc.message, param=exc.param) from None

            async def body() -> AsyncIterator[str]:
                yield records.csv_text(first or [], header=True, operator=f.operator)
                if first is not None:
                    async for batch in batches:
                        yield records.csv_text(batch, operator=f.operator)

            return _csv(body(), f"requests-{tenant}.csv")
        data = await queries.summary(db, tenant, rng)
        return _csv(records.csv_table(CSV_TABLES[table], data[table]), f"usage-{tenant}-{table}.csv")

    @get("/tenants")
    async def tenants(self, session: SessionData, svc: TenancyService) -> dict[str, Any]:
        if not session.is_admin:
            raise NotYours("Only admins list tenants.")
        return {"data": [{"id": t.id, "name": t.name, "status": t.status} for t in (await svc.list_tenants()).items]}

    @get("/deployments")
    async def deployments(self, request: Request[Any, Any, Any], session: SessionData) -> dict[str, Any]:
        if not session.is_admin:
            raise NotYours("Only admins see deployments.")
        rows, seen = [], set()
        for group in request.app.state["services"].router.groups:
            for d in group.deployments:
                if d.id in seen:
                    continue
                seen.add(d.id)
                view = d.health.view()
                rows.append({"deployment": d.id, "model": group.name, "provider": d.config.provider,
                             "state": view.state, "latency_ewma_ms": view.latency_ewma_ms,
                             "requests": view.requests, "errors": view.errors, "error_rate": view.error_rate,
                             "held_for_seconds": view.held_for_seconds})
        return {"data": rows}
