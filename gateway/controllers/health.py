"""``GET /healthz`` (the process is alive) and ``GET /readyz`` (its dependencies answer)."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Controller, Response, get

from gateway.services import Services


class Health(msgspec.Struct):
    status: str


class Readiness(msgspec.Struct):
    status: str  # "ready" | "not_ready"
    models: dict[str, bool]  # public model -> at least one deployment ready
    deployments: dict[str, bool]
    dependencies: dict[str, bool]


async def _check(check: object) -> bool:
    try:
        async with asyncio.timeout(5.0):
            return bool(await check())  # type: ignore[operator]
    except Exception:
        return False


class HealthController(Controller):
    tags = ["Health"]

    @get("/healthz", summary="Liveness")
    async def healthz(self) -> Health:
        return Health(status="ok")

    @get("/readyz", summary="Readiness: every model has a ready deployment and every dependency answers")
    async def readyz(self, services: Services) -> Response[Readiness]:
        names = list(services.readiness)
        groups = services.router.groups  # the table checked: a reload meanwhile installs another
        ready, results = await asyncio.gather(
            services.router.ready(groups), asyncio.gather(*(_check(services.readiness[n]) for n in names))
        )
        dependencies = dict(zip(names, results, strict=True))
        models = {g.name: any(ready[d] for d in g.deployments) for g in groups}
        deployments: dict[str, bool] = {}
        for deployment, ok in ready.items():  # an id several deployments share: ready where each is
            deployments[deployment.id] = deployments.get(deployment.id, True) and ok
        ok = all(models.values()) and all(dependencies.values())
        body = Readiness(status="ready" if ok else "not_ready", models=models, deployments=deployments,
                         dependencies=dependencies)
        return Response(body, status_code=200 if ok else 503)
