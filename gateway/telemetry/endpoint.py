"""``GET /metrics`` in the Prometheus text format (unauthenticated, like any scrape target; it
carries no tenant or key ids)."""

from __future__ import annotations

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler

from gateway.contracts import UsageSink
from gateway.routing.router import Router
from gateway.telemetry.metrics import MEDIA_TYPE, GatewayMetrics, StateCollector


def metrics_route(metrics: GatewayMetrics, router: Router, usage: UsageSink) -> HTTPRouteHandler:
    metrics.watch_engines(router)
    metrics.registry.register(StateCollector(router, usage))

    @get("/metrics", include_in_schema=False, sync_to_thread=False)
    def scrape() -> Response[bytes]:
        return Response(metrics.render(), media_type=MEDIA_TYPE)

    return scrape
