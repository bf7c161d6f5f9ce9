"""Authentication as a ``before_request`` hook, so it runs before the body is even decoded
(an unauthenticated caller gets a 401, never a 400 about its body)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.contracts import Principal
from gateway.pipeline import Pipeline


async def authenticate_request(request: Request[Any, Any, Any]) -> None:
    pipeline: Pipeline = request.app.state["pipeline"]
    request.state.principal = await pipeline.authenticate(request.headers)


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    return request.state.principal
