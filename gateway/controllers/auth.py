"""Authentication as a ``before_request`` hook, so it runs before the body is even decoded
(an unauthenticated caller gets a 401, never a 400 about its body). A throttled client is refused
(429) before its key is looked up; failures are counted and audited, key use audited.

The API controllers take the pipeline from the app's state and the principal from the request's
scope directly: Litestar's dependency injection and ``request.state`` build objects per request.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.auth.guard import client_address, guard_of
from gateway.contracts import Principal
from gateway.errors import ApiError
from gateway.pipeline import Pipeline, bearer_token
from gateway.request_headers import request_headers


def pipeline_of(request: Request[Any, Any, Any]) -> Pipeline:
    pipeline: Pipeline = request.app.state["pipeline"]
    return pipeline


async def authenticate_request(request: Request[Any, Any, Any]) -> None:
    pipeline = pipeline_of(request)
    guard = guard_of(request)
    headers = request_headers(request.scope)
    if guard is None:
        principal = await pipeline.authenticate(headers)
    else:
        client, token = client_address(request), bearer_token(headers)
        if not guard.throttle.blocks_nobody():
            await guard.check(client)
        try:
            principal = await pipeline.authenticate(headers)
        except ApiError as exc:
            if exc.status == 401 and token is not None:  # a wrong key, not a missing one
                await guard.failed(client, token, "api")
            raise
        guard.succeeded(principal, client, "api")
    request.scope.setdefault("state", {})["principal"] = principal  # what request.state.principal reads


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    principal: Principal = request.scope["state"]["principal"]
    return principal
