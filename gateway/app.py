"""The Litestar app factory."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from gateway.controllers.chat import ChatController, create_chat
from gateway.controllers.completions import CompletionsController, create_completion
from gateway.controllers.deployments import DeploymentsController
from gateway.controllers.embeddings import EmbeddingsController
from gateway.controllers.health import HealthController
from gateway.controllers.messages import MessagesController
from gateway.controllers.models import ModelsController
from gateway.controllers.responses import ResponsesController
from gateway.controllers.responses_input import ResponsesInputController
from gateway.controllers.tokenize import TokenizeController
from gateway.dialects.anthropic import on_messages_paths
from gateway.drain import DRAIN
from gateway.errors import exception_handlers
from gateway.event_stream import CLIENT_LEFT, DIRECT_SEND
from gateway.fast_routes import FastRoute, FastRoutes
from gateway.heap import settle_heap
from gateway.held_responses import HeldFollower
from gateway.pipeline import Pipeline
from gateway.reload import Reloader
from gateway.security_headers import add_security_headers
from gateway.services import Services, build_services
from gateway.settings import CONFIG_WARNED_ENV, Settings, load_settings
from gateway.telemetry import Telemetry
from gateway.telemetry.endpoint import metrics_route
from gateway.telemetry.logs import install_logging, lean_log_records
from gateway.telemetry.metrics import MeteredSink
from gateway.telemetry.middleware import TelemetryMiddleware


def create_app(
    settings: Settings, services: Services | None = None, *, config_path: str | Path | None = None,
    telemetry: Telemetry | None = None,
) -> Litestar:
    """An app serving ``settings``; ``services`` defaults to ``build_services(settings)``.

    The app owns the services: they are closed when the app shuts down. With ``config_path``,
    SIGHUP and ``POST /admin/v1/reload`` re-read models and prices from that file.
    ``telemetry`` (metrics, tracing) defaults to what ``settings.telemetry`` asks for.
    """
    services = services or build_services(settings)
    telemetry = telemetry or Telemetry.from_settings(settings)
    extra_routes = []
    if telemetry.metrics is not None:
        extra_routes.append(metrics_route(telemetry.metrics, services.router, services.usage))
        services.usage = MeteredSink(services.usage, telemetry.metrics)
    pipeline = Pipeline(services, settings, telemetry)
    services.readiness["accepting_requests"] = DRAIN.accepting  # False once SIGTERM started the drain
    reloader = Reloader(pipeline, config_path)
    follower = None if services.responses is None else HeldFollower(
        pipeline, services.responses, settings.usage.background_poll_seconds)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        try:
            for start in services.starters:
                await start()
            if follower is not None:
                follower.start()
            reloader.install_sighup()
            telemetry.start()
            DRAIN.install(settings.server.drain_readiness_seconds, settings.server.drain_seconds)
            yield
        finally:
            if follower is not None:
                await follower.aclose()
            if pipeline.keepalives is not None:
                pipeline.keepalives.close()
            await services.aclose()
            await telemetry.aclose()

    app = GatewayApp(
        route_handlers=[
            ChatController, CompletionsController, EmbeddingsController, MessagesController, ModelsController,
            HealthController, TokenizeController, ResponsesController, ResponsesInputController,
            DeploymentsController,
            *services.routes,
            *extra_routes,
        ],
        middleware=[lambda app: TelemetryMiddleware(app, telemetry)],  # type: ignore[list-item,return-value]  # a plain ASGI callable
        before_send=[add_security_headers],
        dependencies={
            "services": Provide(lambda: services, sync_to_thread=False, use_cache=True),
            "pipeline": Provide(lambda: pipeline, sync_to_thread=False, use_cache=True),
        },
        exception_handlers=on_messages_paths(exception_handlers),  # Anthropic's error shape under /v1/messages
        request_max_body_size=settings.server.max_body_bytes,
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="Switchyard",
            version="0.1.0",
            description="One OpenAI-compatible endpoint in front of many LLM providers.",
        ),
        debug=False,
        state=State({"settings": settings, "services": services, "pipeline": pipeline, "reloader": reloader}),
    )
    app.fast_routes = FastRoutes(app, {
        "/v1/chat/completions": (chat := FastRoute(ChatCompletionRequest, create_chat)), "/chat/completions": chat,
        "/v1/completions": (text := FastRoute(CompletionRequest, create_completion)), "/completions": text,
    }, telemetry)  # fmt: skip
    return app


class GatewayApp(Litestar):
    """Litestar that keeps the server's unwrapped ``send`` in each HTTP scope (``EventStream`` sends
    a stream's body through it) and hands the busiest routes to ``fast_routes``."""

    fast_routes: FastRoutes | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope[CLIENT_LEFT] = False  # the server may cancel the request if its client leaves: ended quietly below
        # HEAD is served as GET (RFC 9110 §9.3.2): the server, seeing HEAD in its own scope, sends no body
        served = scope if scope["method"] != "HEAD" else scope | {"method": "GET"}
        served[DIRECT_SEND] = send
        try:
            if self.fast_routes is not None and self.fast_routes.serves(served):
                await self.fast_routes(served, receive, send)
            else:
                await super().__call__(served, receive, send)
        except asyncio.CancelledError:
            # the server cancelled it as the client left (settled as client_disconnected on the way
            # out): not a failure of the app, which the server would log as one
            task = asyncio.current_task()
            if not scope.get(CLIENT_LEFT) or task is None or task.cancelling() > 1:
                raise
            task.uncancel()
        finally:
            # The server's send is bound to its request cycle, which holds the scope: left in place,
            # the pair is a reference cycle, and each request's some 16 objects wait for the
            # garbage collector instead of going as the request ends.
            del served[DIRECT_SEND]


def create_app_from_env() -> Litestar:
    """Factory for ``uvicorn --factory`` (used by ``switchyard serve``): config from $SWITCHYARD_CONFIG."""
    path = os.environ.get("SWITCHYARD_CONFIG") or "config/default.yaml"
    settings = load_settings(path, warn=CONFIG_WARNED_ENV not in os.environ)
    install_logging(json=settings.telemetry.json_logs)  # a served process owns its stderr
    lean_log_records()
    app = create_app(settings, config_path=path)
    app.on_startup.append(settle_heap)  # a served process owns its heap too
    return app
