"""Bearer-token checks for the admin API (admin keys only) and the tenant-scoped endpoints."""

from __future__ import annotations

import logging

from litestar.connection import ASGIConnection

from gateway.admin.service import AdminError
from gateway.auth.guard import client_address, guard_of
from gateway.contracts import Authenticator, Principal


class Unauthorized(AdminError):
    status = 401
    type = "authentication_error"


class MissingKey(Unauthorized):
    code = "missing_api_key"  # as on the API's routes


class InvalidKey(Unauthorized):
    code = "invalid_api_key"  # as on the API's routes, and OpenAI's


class Forbidden(AdminError):
    status = 403
    type = "permission_error"


class AuthUnavailable(AdminError):
    """The key store could not be asked (as on the API path: 503 ``auth_unavailable``)."""

    status = 503
    type = "service_unavailable"
    code = "auth_unavailable"


log = logging.getLogger("switchyard.admin")


def bearer(connection: ASGIConnection) -> str | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def principal_of(connection: ASGIConnection, auth: Authenticator) -> Principal:
    """The key's principal; a throttled client gets 429 first, a failure is counted and audited."""
    guard, client = guard_of(connection), client_address(connection)
    token = bearer(connection)
    if guard is not None:
        await guard.check(client)
    if token is None:
        raise MissingKey("Missing bearer token: send 'Authorization: Bearer <API key>'.")
    try:
        principal = await auth.authenticate(token)
    except Exception:
        log.exception("authenticator failed")
        raise AuthUnavailable("authentication is temporarily unavailable") from None
    if principal is None:
        if guard is not None:
            await guard.failed(client, token, "admin")
        raise InvalidKey("Incorrect API key provided, or the key is revoked or expired.")
    if guard is not None:
        guard.succeeded(principal, client, "admin")
    return principal


async def require_admin(connection: ASGIConnection, auth: Authenticator) -> Principal:
    principal = await principal_of(connection, auth)
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin key.")
    return principal


async def require_tenant(connection: ASGIConnection, auth: Authenticator) -> Principal:
    principal = await principal_of(connection, auth)
    if principal.tenant_id is None:
        raise Forbidden("This endpoint reports on a tenant's own usage; admin keys use /admin/v1/usage.")
    return principal
