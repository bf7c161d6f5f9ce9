"""Prometheus metrics, OpenTelemetry tracing and structured logs, bundled per app as ``Telemetry``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.export import SpanExporter

from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Tracing


@dataclass
class Telemetry:
    metrics: GatewayMetrics | None = None  # None: no /metrics
    tracing: Tracing = field(default_factory=Tracing.off)

    @classmethod
    def from_settings(cls, settings: Settings, exporters: Sequence[SpanExporter] = ()) -> Telemetry:
        cfg = settings.telemetry
        if cfg.json_logs:
            from gateway.telemetry.logs import install_logging

            install_logging(json=True)
        return cls(GatewayMetrics() if cfg.metrics else None, Tracing.from_config(cfg, exporters))

    def start(self) -> None:
        """At the app's start-up: with several workers, publish this worker's metrics periodically."""
        if self.metrics is not None and self.metrics.shared is not None:
            self.metrics.shared.start()

    async def aclose(self) -> None:
        """At the app's shutdown, after its last request: publish the metrics one last time, close tracing."""
        if self.metrics is not None and self.metrics.shared is not None:
            await self.metrics.shared.aclose()
        await self.tracing.aclose()

    def upstream_error(self, deployment: str, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_error(deployment, kind)


__all__ = ["Telemetry"]
