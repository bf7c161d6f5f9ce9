"""Authentication as a ``before_request`` hook, so it runs before the body is even decoded
(an unauthenticated caller gets a 401, never a 400 about its body).

The API controllers take the pipeline from the app's state and the principal from the request's
scope directly: Litestar's dependency injection and ``request.state`` build objects per request.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.contracts import Principal
from gateway.pipeline import Pipeline


def pipeline_of(request: Request[Any, Any, Any]) -> Pipeline:
    pipeline: Pipeline = request.app.state["pipeline"]
    return pipeline


async def authenticate_request(request: Request[Any, Any, Any]) -> None:
    principal = await pipeline_of(request).authenticate(request.headers)
    request.scope.setdefault("state", {})["principal"] = principal  # what request.state.principal reads


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    principal: Principal = request.scope["state"]["principal"]
    return principal
