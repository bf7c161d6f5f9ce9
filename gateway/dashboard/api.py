"""The dashboard's data endpoints under ``/dashboard/api`` (session cookie; JSON or CSV).

Which tenant a request may see is decided here, once, by ``tenant_for``: a tenant's session sees
only its own tenant (asking for another is a 403, whatever the id); an admin's session names
the tenant it wants. Errors answer in the OpenAI shape.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.di import Provide

from gateway.admin.service import AdminError, NotFound, TenancyService
from gateway.auth.authenticator import ADMIN_KEY_ID
from gateway.dashboard import queries
from gateway.dashboard.revocations import Revocations
from gateway.dashboard.sessions import SESSION_COOKIE, SessionData, Sessions
from gateway.db.engine import Database
from gateway.errors import ParameterError

CSV_TABLES = {
    "series": ("t", "requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost"),
    "by_model": ("model", "requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost"),
    "by_key": ("key_id", "requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost"),
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
    if session.key_id != ADMIN_KEY_ID:  # the config's bootstrap admin key has no row to check
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


def _range(start: str | None, end: str | None, bucket: str | None) -> queries.Range:
    try:
        return queries.Range.parse(start, end, bucket)
    except ParameterError as exc:
        raise AdminError(exc.message, param=exc.param) from None


class DashboardApi(Controller):
    path = "/api"
    include_in_schema = False
    dependencies = {"session": Provide(session_of)}

    @get("/me")
    async def me(self, sessions: Sessions, session: SessionData) -> dict[str, Any]:
        role = "admin" if session.is_admin else "tenant"
        return {"role": role, "tenant_id": session.tenant_id, "key_id": session.key_id, "csrf": sessions.csrf(session)}

    @get("/summary")
    async def summary(
        self, session: SessionData, svc: TenancyService, db: Database, tenant_id: str | None = None,
        start: str | None = None, end: str | None = None, bucket: str | None = None,
    ) -> dict[str, Any]:
        tenant = await tenant_for(session, tenant_id, svc)
        return await queries.summary(db, tenant, _range(start, end, bucket))

    @get("/limits")
    async def limits(self, session: SessionData, svc: TenancyService, db: Database,
                     tenant_id: str | None = None) -> dict[str, Any]:
        tenant = await tenant_for(session, tenant_id, svc)
        return await queries.live(db, tenant, await svc.get_limits("tenant", tenant))

    @get("/export.csv")
    async def export(
        self, session: SessionData, svc: TenancyService, db: Database, tenant_id: str | None = None,
        start: str | None = None, end: str | None = None, bucket: str | None = None, table: str = "series",
    ) -> Response[str]:
        if table not in CSV_TABLES:
            raise AdminError(f"table must be one of {', '.join(CSV_TABLES)}", param="table")
        tenant = await tenant_for(session, tenant_id, svc)
        data = await queries.summary(db, tenant, _range(start, end, bucket))
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_TABLES[table])
        for row in data[table]:
            writer.writerow([row[c] for c in CSV_TABLES[table]])
        name = f"usage-{tenant}-{table}.csv"
        return Response(out.getvalue(), media_type="text/csv",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    @get("/tenants")
    async def tenants(self, session: SessionData, svc: TenancyService) -> dict[str, Any]:
        if not session.is_admin:
            raise NotYours("Only admins list tenants.")
        return {"data": [{"id": t.id, "name": t.name, "status": t.status} for t in await svc.list_tenants()]}

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
                             "requests": view.requests, "errors": view.errors, "error_rate": view.error_rate})
        return {"data": rows}
