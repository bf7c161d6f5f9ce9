"""The busiest API routes served without Litestar's router, parameter extraction and middleware chain.

``POST`` to the chat and text completion paths does the same steps as Litestar's route would, in
the same order and with the same parts: the route's own handler object (its ``before_request``
hook, its guards, its body-size limit, its exception handlers, its ``to_response`` and
``after_response``), the app's ``before_send`` hooks, the telemetry middleware, and the body
decoding the route's DTO does. The body is read as ``Request.body()`` reads it, in one loop
(``_read_body``: 3.3 % less CPU per request, ``bench.gateway_ab --phases a``, 20 rounds).
Only the machinery between them is skipped (``bench.gateway_floor``: a Litestar route alone costs
0.086 ms of CPU per request, the whole gateway 0.475 ms); served this way the gateway spends about
7 % less CPU per request (``bench.gateway`` (a), six runs alternating with and without). Every
other method and path, and these routes' OpenAPI description, stay Litestar's; ``tests/gateway/
test_fast_routes.py`` sends each kind of request both ways and gets the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from litestar import Litestar, Request, Response
from litestar.exceptions import ClientException, HTTPException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, ExceptionHandlersMap, HTTPScope, Message, Receive, Send

from gateway.body import decode_body, decoded_content
from gateway.errors import ApiError
from gateway.json_response import JSONResponse
from gateway.request_headers import request_headers
from gateway.telemetry import Telemetry
from gateway.telemetry.middleware import TelemetryMiddleware


@dataclass(frozen=True)
class FastRoute:
    """A route's body type and what it does with a decoded body (shared with its controller)."""

    body_type: type[Any]
    serve: Callable[[Request[Any, Any, Any], Any], Awaitable[Response[Any]]]


class FastRoutes:
    def __init__(self, app: Litestar, routes: Mapping[str, FastRoute], telemetry: Telemetry) -> None:
        self._app = app
        self._routes = routes
        self._handlers = {path: _post_handler(app, path) for path in routes}
        self._plain = {path for path, handler in self._handlers.items() if _adds_nothing(handler)}
        self._telemetry = TelemetryMiddleware(self._serve, telemetry)

    def serves(self, scope: HTTPScope) -> bool:
        return scope["method"] == "POST" and scope["path"] in self._routes

    async def __call__(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        """What ``Litestar.__call__`` and its app-level exception middleware do around a route."""
        app = self._app
        scope["app"] = scope["litestar_app"] = app
        scope.setdefault("state", {})
        scope["route_handler"] = self._handlers[scope["path"]]
        scope["path_params"] = {}
        started = False
        hooks = app.before_send

        async def send_out(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            for hook in hooks:
                await hook(message, scope)
            await send(message)

        try:
            await self._telemetry(scope, receive, send_out)  # type: ignore[arg-type]  # a plain ASGI middleware
        except Exception as exc:
            if started:  # as Litestar does: the answer is under way, the server closes the connection
                raise
            await self._error(scope, receive, send_out, exc)

    async def _serve(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        """What ``HTTPRoute.handle`` and the route's exception middleware do."""
        app, path = self._app, scope["path"]
        handler = self._handlers[path]
        request: Request[Any, Any, Any] = app.request_class(scope=scope, receive=receive, send=send)
        try:
            if handler.resolve_guards():
                await handler.authorize_connection(connection=request)
            before = handler.resolve_before_request()
            result = await before(request) if before is not None else None
            if not result:
                route = self._routes[path]
                limit = handler.resolve_request_max_body_size()
                if not (body := await _read_body(request, receive, limit)):
                    # as Litestar's missing `data` is (``gateway.errors``)
                    raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
                if (encoding := request_headers(scope).get("content-encoding")) is not None:  # as WireBody
                    body = decoded_content(body, encoding, limit)
                result = await route.serve(request, decode_body(body, route.body_type))
            if type(result) is JSONResponse and path in self._plain and result.sends_itself():
                response: ASGIApp = result.send_to  # what to_response would make of it, without its layers
            else:
                response = await handler.to_response(app=app, data=result, request=request)
        except Exception as exc:
            await self._error(scope, receive, send, exc)
            return
        await response(scope, receive, send)
        if (after := handler.resolve_after_response()) is not None:
            await after(request)

    async def _error(self, scope: HTTPScope, receive: Receive, send: Send, exc: Exception) -> None:
        handler = self._handlers[scope["path"]]
        request: Request[Any, Any, Any] = self._app.request_class(scope=scope, receive=receive, send=send)
        make = _exception_handler(handler.resolve_exception_handlers(), exc)
        response = make(request, exc) if make is not None else ApiError(500, "internal error").to_response()
        await response.to_asgi_response(app=None, request=request, type_encoders=handler.resolve_type_encoders())(
            scope, receive, send
        )


async def _read_body(request: Request[Any, Any, Any], receive: Receive, limit: int | None) -> bytes:
    """The body, as ``request.body()`` reads it (Litestar's ``Request.stream``) without its async
    generator and list of chunks: 413 when the announced length or the bytes sent pass ``limit``,
    500 when the client leaves mid-body. Nothing on these routes reads the body again."""
    most = limit or math.inf
    if (announced := _content_length(request.scope)) is not None and announced > most:
        raise RequestEntityTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] == "http.request":
            if chunk := event["body"]:
                size += len(chunk)
                if size > most:
                    raise RequestEntityTooLarge
                chunks.append(chunk)
            if not event.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        elif event["type"] == "http.disconnect":
            raise InternalServerException("client disconnected prematurely")


def _content_length(scope: HTTPScope) -> int | None:
    """``request.content_length``: the header's value; a bad one is a 400 (Litestar's ClientException)."""
    value = request_headers(scope).get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ClientException(f"Invalid content-length: {value!r}") from None


def _post_handler(app: Litestar, path: str) -> HTTPRouteHandler:
    for route in app.routes:
        if isinstance(route, HTTPRoute) and route.path == path and "POST" in route.route_handler_map:
            return route.route_handler_map["POST"][0]
    raise LookupError(f"no POST route {path} to serve directly")


def _adds_nothing(handler: HTTPRouteHandler) -> bool:
    """Whether the route's ``to_response`` puts nothing of its own into a ``Response`` returned to
    it: no return DTO, after-request hook, background task, response headers or cookies, on the
    route or any layer above it, and the status code that ``JSONResponse.send_to`` defaults to."""
    return (handler.resolve_return_dto() is None and not any(layer.after_request for layer in handler.ownership_layers)
            and handler.background is None and not handler.resolve_response_headers()
            and not handler.resolve_response_cookies() and handler.status_code == 200)


def _exception_handler(handlers: ExceptionHandlersMap, exc: Exception) -> Callable[..., Response[Any]] | None:
    """Litestar's choice: a handler for the status code of an HTTPException first, then the
    closest class in the exception's MRO."""
    if isinstance(exc, HTTPException) and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
