"""Admin views of routing: ``GET /admin/v1/deployments`` (health), ``GET /admin/v1/engine/tenants``
(per-tenant figures of the local engines' fair scheduling) and ``POST /admin/v1/reload``."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post

from backends.base import EngineBacked
from gateway.controllers.auth import authenticate_request, principal_of
from gateway.controllers.docs import error_responses
from gateway.errors import ApiError
from gateway.reload import Reloader
from gateway.services import Services
from gateway.settings import ConfigError


class DeploymentState(msgspec.Struct):
    model: str
    deployment: str
    provider: str
    upstream_model: str
    state: str  # healthy | open | cooling | held (its upstream asked for no request until held_for_seconds pass)
    latency_ewma_ms: float | None
    in_flight: int
    queue_depth: int
    requests: int
    errors: int
    error_rate: float
    consecutive_failures: int
    held_for_seconds: float  # 0: the upstream takes requests now


class DeploymentList(msgspec.Struct):
    data: list[DeploymentState]


class EngineTenant(msgspec.Struct):
    deployment: str
    tenant_id: str | None  # None: requests that came with no tenant (admin keys, the engine's own use)
    weight: float
    waiting: int
    running: int
    tokens_scheduled: int


class EngineTenantList(msgspec.Struct):
    data: list[EngineTenant]


class ReloadResult(msgspec.Struct):
    models: list[str]
    workers_restarting: bool = False  # several workers: they are being replaced, one by one, on the new file
    restart_required: list[str] = msgspec.field(default_factory=list)  # changed, applied only by a restart


def _require_admin(request: Request[Any, Any, Any]) -> None:
    if not principal_of(request).is_admin:
        raise ApiError(403, "this endpoint needs an admin key", code="admin_required")


class DeploymentsController(Controller):
    path = "/admin/v1"
    tags = ["Admin"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @get("/deployments", summary="Each deployment's health, latency and load", responses=error_responses(401, 403))
    async def deployments(self, request: Request[Any, Any, Any], services: Services) -> DeploymentList:
        _require_admin(request)
        rows = []
        for group in services.router.groups:
            for d in group.deployments:
                view, stats = d.health.view(), d.backend.stats()
                rows.append(DeploymentState(
                    model=group.name, deployment=d.id, provider=d.config.provider, upstream_model=d.config.model,
                    state=view.state, latency_ewma_ms=view.latency_ewma_ms, in_flight=stats.in_flight,
                    queue_depth=stats.queue_depth, requests=view.requests, errors=view.errors,
                    error_rate=view.error_rate, consecutive_failures=view.consecutive_failures,
                    held_for_seconds=view.held_for_seconds,
                ))
        return DeploymentList(data=rows)

    @get("/engine/tenants", summary="Each local engine's per-tenant queue, batch and tokens scheduled",
         responses=error_responses(401, 403))
    async def engine_tenants(self, request: Request[Any, Any, Any], services: Services) -> EngineTenantList:
        _require_admin(request)
        rows, seen = [], set()
        for d in services.router.deployments():
            if d.id in seen or not isinstance(d.backend, EngineBacked):
                continue
            seen.add(d.id)
            for tenant, f in d.backend.engine_metrics().tenants.items():
                rows.append(EngineTenant(deployment=d.id, tenant_id=tenant or None, weight=f.weight,
                                         waiting=f.num_waiting, running=f.num_running,
                                         tokens_scheduled=f.tokens_scheduled))
        return EngineTenantList(data=rows)

    @post("/reload", status_code=200, summary="Re-read the config file: models and prices",
          responses=error_responses(400, 401, 403))
    async def reload(self, request: Request[Any, Any, Any]) -> ReloadResult:
        _require_admin(request)
        reloader: Reloader = request.app.state["reloader"]
        try:
            fresh, restarting, unapplied = await reloader.reload_everywhere()
        except ConfigError as exc:
            raise ApiError(400, str(exc), code="invalid_config") from None
        return ReloadResult(models=[m.name for m in fresh.models], workers_restarting=restarting,
                            restart_required=unapplied)
