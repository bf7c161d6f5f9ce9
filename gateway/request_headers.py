"""A request's headers as a plain ``dict`` of lower-case names, made once per request from the ASGI
scope and kept there. Litestar's ``request.headers`` makes a ``Headers`` object with type checks
per header (py-spy: 1.5-2 % of a completion's CPU); the API routes only look names up."""

from __future__ import annotations

from typing import Any

_KEY = "switchyard.headers"


def request_headers(scope: Any) -> dict[str, str]:
    """Name -> value; a repeated header keeps its first value, as ``Headers.get`` does."""
    headers: dict[str, str] | None = scope.get(_KEY)
    if headers is None:
        headers = scope[_KEY] = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in reversed(scope["headers"])
        }
    return headers
