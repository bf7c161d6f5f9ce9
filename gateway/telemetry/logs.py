"""Structured JSON logs: one object per line, with the request's id, tenant, model, status and
latency when a request is in progress. Keys, prompts and answers are never logged: the access line
carries ids, counts and timings only."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

from gateway.telemetry.context import RequestInfo, request_info

_encoder = msgspec.json.Encoder()
ACCESS = logging.getLogger("switchyard.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        info = request_info()
        if info is not None:
            out["request_id"] = info.request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return _encoder.encode(out).decode()


def install_json_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the ``switchyard`` loggers (idempotent)."""
    root = logging.getLogger("switchyard")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def access_fields(info: RequestInfo, started: float) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": info.request_id, "method": info.method, "path": info.path, "status": info.status,
        "latency_ms": round((time.perf_counter() - started) * 1000, 3), "tenant_id": info.tenant_id,
        "key_id": info.key_id, "model": info.model,
    }  # fmt: skip
    for name in ("deployment", "error_type", "prompt_tokens", "completion_tokens"):
        value = getattr(info, name)
        if value is not None:
            fields[name] = value
    return fields


def log_access(info: RequestInfo, started: float) -> None:
    if ACCESS.isEnabledFor(logging.INFO):
        ACCESS.info("%s %s %s", info.method, info.path, info.status, extra={"fields": access_fields(info, started)})
