"""What every place that takes a key (the API, the admin API, the dashboard sign-in) does around
authenticating it: refuse a throttled client first, then count and audit a failure, or audit the
key's use. ``Services.auth_guard`` holds one; without it (test doubles, engine nodes) nothing is
throttled or audited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection

from gateway.auth.audit import AuditLog, Event, Surface
from gateway.auth.throttle import AuthThrottle, Throttled, key_prefix
from gateway.contracts import Principal
from gateway.errors import ApiError


def client_address(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The client's address: the peer's, or the one a trusted proxy's X-Forwarded-For names
    (``server.trusted_proxies``)."""
    client = connection.client
    return client.host if client is not None else "unknown"


def throttled_error(exc: Throttled) -> ApiError:
    return ApiError(429, f"Too many failed authentication attempts from this {exc.scope}; retry after "
                         f"{exc.retry_after} s.", code="too_many_failed_attempts",
                    headers={"retry-after": str(exc.retry_after)})


@dataclass
class AuthGuard:
    throttle: AuthThrottle
    audit: AuditLog

    async def check(self, client: str) -> None:
        """Raise ``ApiError`` 429 (with Retry-After) while this client address is throttled."""
        try:
            await self.throttle.check(client)
        except Throttled as exc:
            raise throttled_error(exc) from None

    async def failed(self, client: str, token: str | None, surface: Surface, event: Event = "key_failed") -> None:
        """Count and audit a failure; raise ``ApiError`` 429 when the token's key prefix is throttled
        (the caller answers 401 otherwise)."""
        self.audit.record(event, client=client, surface=surface, key_prefix=key_prefix(token))
        try:
            await self.throttle.failed(client, token)
        except Throttled as exc:
            raise throttled_error(exc) from None

    def succeeded(self, principal: Principal, client: str, surface: Surface) -> None:
        self.audit.key_used(principal, client=client, surface=surface)


def guard_of(connection: ASGIConnection[Any, Any, Any, Any]) -> AuthGuard | None:
    services = connection.app.state.get("services")
    return getattr(services, "auth_guard", None)
