"""Admin views of routing: ``GET /admin/v1/deployments`` (health) and ``POST /admin/v1/reload``."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post

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
    state: str  # healthy | open | cooling
    latency_ewma_ms: float | None
    in_flight: int
    queue_depth: int
    requests: int
    errors: int
    error_rate: float
    consecutive_failures: int


class DeploymentList(msgspec.Struct):
    data: list[DeploymentState]


class ReloadResult(msgspec.Struct):
    models: list[str]


def _require_admin(request: Request[Any, Any, Any]) -> None:
    if not principal_of(request).is_admin:
        raise ApiError(403, "this endpoint needs an admin key", code="admin_required")


class DeploymentsController(Controller):
    path = "/admin/v1"
    tags = ["Admin"]
    before_request = authenticate_request

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
                ))
        return DeploymentList(data=rows)

    @post("/reload", status_code=200, summary="Re-read the config file: models and prices",
          responses=error_responses(400, 401, 403))
    async def reload(self, request: Request[Any, Any, Any]) -> ReloadResult:
        _require_admin(request)
        reloader: Reloader = request.app.state["reloader"]
        try:
            fresh = reloader.reload()
        except ConfigError as exc:
            raise ApiError(400, str(exc), code="invalid_config") from None
        return ReloadResult(models=[m.name for m in fresh.models])
