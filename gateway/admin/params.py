"""NUL characters in what the admin API, ``/v1/usage`` and the dashboard read are a 400 naming the
parameter, checked in one place before any handler runs.

PostgreSQL text cannot hold NUL (asyncpg raises ``CharacterNotInRepertoireError``: it was a 500, with
the raw character in the log), and no id, name or filter needs one. Path and query parameters are
checked by ``refuse_nul``, the routers' ``before_request`` hook (it runs after the guards, before
the parameters are parsed and the dependencies resolved); JSON body fields by ``nul_field`` (called
by ``gateway.admin.schemas.decode``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request

from gateway.admin.service import AdminError

NUL = "\x00"


def nul_error(param: str) -> AdminError:
    return AdminError(f"{param} contains a NUL character (\\u0000), which is not allowed", param=param)


def _shown(name: str) -> str:
    return name.replace(NUL, "\\u0000")


async def refuse_nul(request: Request[Any, Any, Any]) -> None:
    """A 400 naming the first path or query parameter that holds a NUL."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and NUL in value:
            raise nul_error(name)
    for name, value in request.query_params.multi_items():
        if NUL in name or NUL in value:
            raise nul_error(_shown(name))


def nul_field(value: Any, path: str = "") -> str | None:
    """The path (``name``, ``models[2]``) of the first string in ``value`` (a decoded body) that
    holds a NUL, or None."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, str):
        return (path or "body") if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if NUL in str(key):
                return _shown(where)
            if (found := nul_field(item, where)) is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := nul_field(item, f"{path}[{i}]")) is not None:
                return found
    return None
