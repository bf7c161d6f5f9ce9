"""The admin REST API under /admin/v1 (admin keys only) and the tenant-scoped GET /v1/usage.

``admin_routers(...)`` returns Routers for the app factory to mount. Every failure answers in
OpenAI's error shape (``{"error": {...}}``) with a fitting status.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from litestar import Controller, Request, Response, Router, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler

from gateway.admin.auth import require_admin, require_tenant
from gateway.admin.pages import Page
from gateway.admin.params import refuse_nul
from gateway.admin.schemas import AdminBody, KeyCreate, KeyRotate, LimitsBody, TenantCreate, TenantUpdate, decode
from gateway.admin.service import MIN_KEY_SECONDS, AdminError, CreatedKey, TenancyService, page_query
from gateway.auth.audit import EVENTS, list_events
from gateway.body import request_content
from gateway.contracts import Authenticator, Principal
from gateway.controllers.docs import error_responses
from gateway.db.engine import Database
from gateway.errors import ParameterError, database_exception_handlers
from gateway.usage.report import GROUPS, ReportQuery, end_of_day, parse_day, usage_report

# Every failure is documented with the body it really has (OpenAI's shape), not Litestar's default.
ERRORS = error_responses(400, 401, 403, 404, 409, 429, 503)
# A PATCH with no body changes nothing, as {} does (a body of blanks decodes to {} too; see AdminBody)
NO_CHANGES = TenantUpdate()
NO_LIMIT_CHANGES = LimitsBody()


def _error(_: Request, exc: AdminError) -> Response[bytes]:
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return Response(msgspec.json.encode(body), status_code=exc.status, media_type="application/json")


def _listing(page: Page[Any]) -> dict[str, Any]:
    data = [asdict(i) for i in page.items]
    return {"object": "list", "data": data, "has_more": page.has_more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _created_key(created: CreatedKey) -> dict[str, Any]:
    return {**asdict(created.key), "key": created.secret}


def _report_query(
    start: str | None, end: str | None, group_by: list[str] | None, default: tuple[str, ...], **filters: str | None
) -> ReportQuery:
    """``group_by`` comma-separated, or repeated (``group_by=model&group_by=day``): every value counts."""
    try:
        joined = ",".join(group_by or ())
        groups = tuple(g.strip() for g in joined.split(",") if g.strip()) if joined else default
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            raise AdminError(f"cannot group by {unknown[0]!r}; choose from {', '.join(GROUPS)}", param="group_by")
        lo = parse_day(start, "start") if start else None
        hi = end_of_day(end, "end") if end else None
        if lo is not None and hi is not None and lo >= hi:
            raise AdminError("start must be before end", param="start")
        return ReportQuery(start=lo, end=hi, group_by=groups, **filters)
    except ParameterError as exc:
        raise AdminError(exc.message, param=exc.param) from None


class TenantController(Controller):
    path = "/tenants"

    @get("/", responses=ERRORS)
    async def list_tenants(self, svc: TenancyService, limit: int | None = None, after: str | None = None
                           ) -> dict[str, Any]:
        return _listing(await svc.list_tenants(page_query(limit, after)))

    @post("/", responses=ERRORS, status_code=201, dto=AdminBody[TenantCreate], return_dto=None)
    async def create_tenant(self, svc: TenancyService, data: TenantCreate) -> dict[str, Any]:
        return asdict(await svc.create_tenant(data.name, weight=data.weight))

    @get("/{tenant_id:str}", responses=ERRORS)
    async def show_tenant(self, svc: TenancyService, tenant_id: str) -> dict[str, Any]:
        return asdict(await svc.get_tenant(tenant_id))

    @patch("/{tenant_id:str}", responses=ERRORS, dto=AdminBody[TenantUpdate], return_dto=None)
    async def update_tenant(self, svc: TenancyService, tenant_id: str,
                            data: TenantUpdate = NO_CHANGES) -> dict[str, Any]:
        changes = {f: getattr(data, f) for f in data.__struct_fields__ if getattr(data, f) is not msgspec.UNSET}
        return asdict(await svc.update_tenant(tenant_id, **changes))

    @post("/{tenant_id:str}/disable", responses=ERRORS, status_code=200)
    async def disable_tenant(self, svc: TenancyService, tenant_id: str) -> dict[str, Any]:
        return asdict(await svc.update_tenant(tenant_id, status="disabled"))

    @post("/{tenant_id:str}/enable", responses=ERRORS, status_code=200)
    async def enable_tenant(self, svc: TenancyService, tenant_id: str) -> dict[str, Any]:
        return asdict(await svc.update_tenant(tenant_id, status="active"))

    @get("/{tenant_id:str}/keys", responses=ERRORS)
    async def tenant_keys(self, svc: TenancyService, tenant_id: str, limit: int | None = None,
                          after: str | None = None) -> dict[str, Any]:
        return _listing(await svc.list_keys(tenant_id, page_query(limit, after)))

    @get("/{tenant_id:str}/limits", responses=ERRORS)
    async def get_limits(self, svc: TenancyService, tenant_id: str) -> dict[str, Any]:
        return (await svc.get_limits("tenant", tenant_id)).as_dict()

    @put("/{tenant_id:str}/limits", responses=ERRORS, dto=AdminBody[LimitsBody], return_dto=None)
    async def put_limits(self, svc: TenancyService, tenant_id: str, data: LimitsBody,
                         request: Request) -> dict[str, Any]:
        await _refuse_blank(request)
        return (await svc.set_limits("tenant", tenant_id, data.as_limits())).as_dict()

    @patch("/{tenant_id:str}/limits", responses=ERRORS, dto=AdminBody[LimitsBody], return_dto=None)
    async def patch_limits(self, svc: TenancyService, tenant_id: str,
                           data: LimitsBody = NO_LIMIT_CHANGES) -> dict[str, Any]:
        return (await svc.update_limits("tenant", tenant_id, **data.changes())).as_dict()


class KeyController(Controller):
    path = "/keys"

    @get("/", responses=ERRORS)
    async def list_keys(self, svc: TenancyService, tenant_id: str | None = None, limit: int | None = None,
                        after: str | None = None) -> dict[str, Any]:
        return _listing(await svc.list_keys(tenant_id, page_query(limit, after)))

    @post("/", responses=ERRORS, status_code=201, dto=AdminBody[KeyCreate], return_dto=None)
    async def create_key(self, svc: TenancyService, data: KeyCreate) -> dict[str, Any]:
        expires = data.expires_at
        if data.expires_in_seconds is not None and expires is not None:
            raise AdminError("give expires_in_seconds or expires_at, not both", param="expires_in_seconds")
        if data.expires_in_seconds is not None:
            if data.expires_in_seconds < MIN_KEY_SECONDS:
                raise AdminError(
                    f"expires_in_seconds must be at least {MIN_KEY_SECONDS}, got {data.expires_in_seconds!r}: "
                    "a key that expires sooner has expired before it can be used",
                    param="expires_in_seconds",
                )
            expires = datetime.now(UTC) + timedelta(seconds=data.expires_in_seconds)
        elif expires is not None and expires.replace(tzinfo=expires.tzinfo or UTC) <= datetime.now(UTC):
            # its secret would be shown once, for a key that never works
            raise AdminError("expires_at must be in the future", param="expires_at")
        created = await svc.create_key(
            data.tenant_id, name=data.name, models=data.models, expires_at=expires, admin=data.admin
        )
        return _created_key(created)

    @get("/{key_id:str}", responses=ERRORS)
    async def show_key(self, svc: TenancyService, key_id: str) -> dict[str, Any]:
        return asdict(await svc.get_key(key_id))

    @post("/{key_id:str}/revoke", responses=ERRORS, status_code=200)
    async def revoke_key(self, svc: TenancyService, key_id: str) -> dict[str, Any]:
        return asdict(await svc.revoke_key(key_id))

    @post("/{key_id:str}/rotate", responses=ERRORS, status_code=201)
    async def rotate_key(self, svc: TenancyService, key_id: str, request: Request) -> dict[str, Any]:
        body = decode(request_content(request, await request.body()), KeyRotate)  # optional here: {} by default
        return _created_key(await svc.rotate_key(key_id, grace_seconds=body.grace_seconds))

    @get("/{key_id:str}/limits", responses=ERRORS)
    async def get_limits(self, svc: TenancyService, key_id: str) -> dict[str, Any]:
        return (await svc.get_limits("key", key_id)).as_dict()

    @put("/{key_id:str}/limits", responses=ERRORS, dto=AdminBody[LimitsBody], return_dto=None)
    async def put_limits(self, svc: TenancyService, key_id: str, data: LimitsBody,
                         request: Request) -> dict[str, Any]:
        await _refuse_blank(request)
        return (await svc.set_limits("key", key_id, data.as_limits())).as_dict()

    @patch("/{key_id:str}/limits", responses=ERRORS, dto=AdminBody[LimitsBody], return_dto=None)
    async def patch_limits(self, svc: TenancyService, key_id: str,
                           data: LimitsBody = NO_LIMIT_CHANGES) -> dict[str, Any]:
        return (await svc.update_limits("key", key_id, **data.changes())).as_dict()


class UsageController(Controller):
    path = "/usage"

    @get("/", responses=ERRORS)
    async def report(
        self,
        db: Database,
        svc: TenancyService,
        start: str | None = None,
        end: str | None = None,
        group_by: list[str] | None = None,
        tenant_id: str | None = None,
        key_id: str | None = None,
    ) -> dict[str, Any]:
        q = _report_query(start, end, group_by, ("tenant", "model", "day"), key_id=key_id)
        if key_id is not None:
            await svc.check_key_filter(key_id)
        if tenant_id is not None:  # an id or a name, as everywhere else in the admin API
            q = replace(q, tenant_id=(await svc.get_tenant(tenant_id, param="tenant_id")).id)
        return {"object": "list", "data": await usage_report(db, q)}


class AuditController(Controller):
    path = "/audit"

    @get("/", responses=ERRORS)
    async def events(
        self,
        db: Database,
        svc: TenancyService,
        event: str | None = None,
        key_id: str | None = None,
        tenant_id: str | None = None,
        client: str | None = None,
        since: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        """Sign-ins, sign-outs, failed attempts and key use, newest first."""
        if event is not None and event not in EVENTS:
            raise AdminError(f"event must be one of {', '.join(EVENTS)}", param="event")
        if not 1 <= limit <= 1000:
            raise AdminError(f"limit must be between 1 and 1000, got {limit}", param="limit")
        try:
            start = parse_day(since, "since") if since else None
        except ParameterError as exc:
            raise AdminError(exc.message, param=exc.param) from None
        if key_id is not None:
            await svc.check_key_filter(key_id)
        if tenant_id is not None:
            tenant_id = (await svc.get_tenant(tenant_id, param="tenant_id")).id
        rows = await list_events(db, event=event, key_id=key_id, tenant_id=tenant_id, client=client, since=start,
                                 limit=limit)
        return {"object": "list", "data": rows}


async def _refuse_blank(request: Request) -> None:
    """A PUT of limits replaces them all: one with a body of blanks (decoded as {}) would clear every
    limit by mistake, so it is refused as a missing body is; ``{}`` clears them."""
    if not request_content(request, await request.body()).strip():
        raise AdminError("the request body must be a JSON object (PUT replaces every limit: {} clears them all)")


def admin_routers(svc: TenancyService, db: Database, auth: Authenticator) -> list[Router]:
    """The /admin/v1 router (admin keys only) and the tenant-scoped /v1/usage router."""

    async def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        await require_admin(connection, auth)

    async def tenant_principal(request: Request) -> Principal:
        return await require_tenant(request, auth)

    @get("/usage", responses=ERRORS)
    async def own_usage(
        db: Database,
        principal: Principal,
        start: str | None = None,
        end: str | None = None,
        group_by: list[str] | None = None,
        key_id: str | None = None,
    ) -> dict[str, Any]:
        q = _report_query(start, end, group_by, ("model", "day"), tenant_id=principal.tenant_id, key_id=key_id)
        return {"object": "list", "data": await usage_report(db, q)}

    deps = {
        "svc": Provide(lambda: svc, sync_to_thread=False),
        "db": Provide(lambda: db, sync_to_thread=False),
    }
    handlers = {AdminError: _error, **database_exception_handlers}
    admin = Router(
        path="/admin/v1",
        route_handlers=[TenantController, KeyController, UsageController, AuditController],
        guards=[admin_guard],
        before_request=refuse_nul,  # a NUL in a path or query parameter: 400 naming it
        dependencies=deps,
        exception_handlers=handlers,  # type: ignore[arg-type]
        tags=["admin"],
    )
    tenant = Router(
        path="/v1",
        route_handlers=[own_usage],
        before_request=refuse_nul,
        dependencies={**deps, "principal": Provide(tenant_principal)},
        exception_handlers=handlers,  # type: ignore[arg-type]
        tags=["usage"],
    )
    return [admin, tenant]
