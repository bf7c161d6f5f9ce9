"""The services a running app uses, and the embedded implementations needed without SQL/Redis.

``build_services(settings)`` assembles them. The production pieces (SQL-backed API keys, Redis
quotas, the batched usage writer) plug in here behind the same protocols (``gateway.contracts``).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from typing import Any

from backends.factory import build_backend
from gateway.admin.tenancy import Tenancy
from gateway.contracts import Admission, Authenticator, Principal, Ticket, UsageRecord, UsageSink
from gateway.router import Router
from gateway.settings import Settings

log = logging.getLogger("switchyard.usage")

ReadinessCheck = Callable[[], Awaitable[bool]]


class AdminKeyAuthenticator:
    """Accepts exactly the configured bootstrap admin key (constant-time comparison)."""

    def __init__(self, admin_key: str | None) -> None:
        self._key = admin_key.encode() if admin_key else None

    async def authenticate(self, token: str) -> Principal | None:
        if self._key is None or not hmac.compare_digest(token.encode(), self._key):
            return None
        return Principal(key_id="admin", tenant_id=None, is_admin=True)


class NoQuotaAdmission:
    """Admits everything and reserves nothing: the embedded default until quotas are configured."""

    async def admit(self, principal: Principal, model: str, reserve_tokens: int) -> Ticket:
        return Ticket(principal=principal, model=model, reserved_tokens=reserve_tokens)

    async def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> None:
        return None


class LoggingUsageSink:
    """Writes each usage record to the log (no storage): the embedded default."""

    def record(self, record: UsageRecord) -> None:
        log.info(
            "usage %s key=%s model=%s deployment=%s status=%s tokens=%s+%s%s",
            record.request_id, record.key_id, record.model, record.deployment, record.status,
            record.prompt_tokens, record.completion_tokens, "" if record.exact else " (estimated)",
        )


@dataclass
class Services:
    authenticator: Authenticator
    admission: Admission
    usage: UsageSink
    router: Router
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)  # name -> check, for /readyz
    routers: list[Any] = field(default_factory=list)  # extra Litestar route handlers the app mounts
    starters: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at app start-up
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at shutdown, reversed

    async def start(self) -> None:
        for start in self.starters:
            await start()
    starters: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at app start-up
    routes: list[Any] = field(default_factory=list)  # extra route handlers / Routers the app mounts

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
        readiness={"database": tenancy.ready},
        closers=[tenancy.aclose],
        starters=[tenancy.start],
        routes=tenancy.routers(),
    )
