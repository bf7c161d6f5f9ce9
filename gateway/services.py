"""The services a running app uses, behind the protocols of ``gateway.contracts``.

``build_services(settings)`` assembles them: SQL-backed API keys (plus the bootstrap admin key),
quotas (Redis or in-process), the batched usage writer and the admin API, from ``gateway.admin``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from backends.factory import build_backend
from gateway.admin.tenancy import Tenancy
from gateway.contracts import Admission, Authenticator, UsageSink
from gateway.routing.router import Router
from gateway.settings import Settings

ReadinessCheck = Callable[[], Awaitable[bool]]


@dataclass
class Services:
    authenticator: Authenticator
    admission: Admission
    usage: UsageSink
    router: Router
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)  # name -> check, for /readyz
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at shutdown, reversed
    starters: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at app start-up
    routes: list[Any] = field(default_factory=list)  # extra route handlers / Routers the app mounts
    # Engine nodes: take the tenant a gateway forwards (backends.tenant headers) for principals without one.
    tenant_from_headers: bool = False

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            try:
                await close()
            except Exception:
                logging.getLogger("switchyard").exception("error while closing a service")
        await self.router.aclose()


def build_services(settings: Settings) -> Services:
    tenancy = Tenancy.from_settings(settings)  # SQL keys, quotas, metering, admin API (gateway.admin)
    return Services(
        authenticator=tenancy.authenticator,
        admission=tenancy.admission,
        usage=tenancy.usage,
        router=Router.from_settings(settings, build_backend),
        readiness=tenancy.readiness(),
        closers=[tenancy.aclose],
        starters=[tenancy.start],
        routes=tenancy.routers(),
    )
