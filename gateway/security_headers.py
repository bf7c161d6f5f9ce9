"""Security headers on every response: ``nosniff`` everywhere; on the dashboard also a content
security policy, frame denial, no referrer and no caching. A Litestar ``before_send`` hook, so
404s, 405s and error responses outside any route get them too."""

from __future__ import annotations

from litestar.types import Message, Scope

DASHBOARD_PREFIX = "/dashboard"
DASHBOARD_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_ALWAYS: list[tuple[bytes, bytes]] = [(b"x-content-type-options", b"nosniff")]
_DASHBOARD: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", DASHBOARD_CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
_WITH_DASHBOARD = _ALWAYS + _DASHBOARD


async def add_security_headers(message: Message, scope: Scope) -> None:
    """Adds the headers above to a response's start message unless the response set them."""
    if message["type"] != "http.response.start" or scope["type"] != "http":
        return
    path = scope.get("path", "")
    extra = _WITH_DASHBOARD if path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/") else _ALWAYS
    headers = list(message.get("headers", []))
    present = [name.lower() for name, _ in headers]  # bytes or bytearray: a list compares both
    headers.extend((name, value) for name, value in extra if name not in present)
    message["headers"] = headers
