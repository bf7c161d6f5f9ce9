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

    def upstream_error(self, deployment: str, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_error(deployment, kind)


__all__ = ["Telemetry"]
