"""Each local engine's figures on ``GET /metrics`` in vLLM's names (``vllm:*``, ``model_name`` = the deployment).

The counters and histograms (tokens, prefix-cache lookups, preemptions, latencies, tokens scheduled by
weight class) go into the worker's published ``Figures``, so with ``--workers N`` a scrape shows the
whole server's, as for the request counters (``gateway.telemetry.shared_metrics``): each worker runs
its own engine, and a worker that exited keeps counting with its last figures. The gauges of live
state (requests running and waiting, KV-cache usage, sequences by weight class) are the answering
worker's own, read when scraped: an exited worker runs nothing, so its last figures must not count on,
and a fraction of one engine's KV cache does not add up across engines.

A config reload may replace a deployment's engine (its options changed: a new engine, its counters
at zero, under the same id): the replaced engine keeps counting with its last figures read, as an
exited worker's do, so the counters never go back.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from gateway.telemetry.shared_metrics import Counts, Figures, Histogram, Labels, merge

Engines = Callable[[], list[tuple[str, Any]]]  # (deployment id, its backend: an ``EngineBacked``) of each engine

GAUGES = {
    "vllm:num_requests_running": ("Requests in the engine's running batch", "num_running"),
    "vllm:num_requests_waiting": ("Requests waiting to be scheduled", "num_waiting"),
    "vllm:kv_cache_usage_perc": ("Fraction of KV-cache blocks in use (0..1)", "kv_usage"),
}
COUNTERS = {  # family name (without _total) -> (doc, snapshot attribute)
    "vllm:prefix_cache_queries": ("Prompt tokens looked up in the prefix cache", "prefix_cache_queries"),
    "vllm:prefix_cache_hits": ("Prompt tokens served from the prefix cache", "prefix_cache_hits"),
    "vllm:num_preemptions": ("Sequences preempted (recomputed)", "num_preemptions"),
    "vllm:prompt_tokens": ("Prompt tokens processed", "prompt_tokens"),
    "vllm:generation_tokens": ("Tokens generated", "generation_tokens"),
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Time to the first token", "ttft"),
    "vllm:inter_token_latency_seconds": ("Time between output tokens", "itl"),
    "vllm:e2e_request_latency_seconds": ("Arrival to finish", "e2e_latency"),
}
SCHEDULED = "switchyard_engine_tokens_scheduled_by_weight_class"
SCHEDULED_DOC = "Prefill and decode tokens scheduled, by the tenant weight class"
LABELS = ["model_name"]
WEIGHT_LABELS = ["model_name", "weight_class"]


class EngineFigures:
    """The local engines' counters and histograms as ``Figures``, read when published or scraped
    (never on the request path). A series' start is when this worker first read its engine;
    ``bounds``: each histogram's bucket bounds, as the engines report them (the same in every worker)."""

    def __init__(self, engines: Engines) -> None:
        self.engines = engines
        self.bounds: dict[str, tuple[float, ...]] = {}
        self._created: dict[str, float] = {}
        self._read: dict[int, tuple[weakref.ref[Any], Figures]] = {}  # by id(backend): its engine's last figures
        self._replaced = Figures({}, {})  # the engines no longer served (a reload replaced or removed them)

    def figures(self) -> Figures:
        read: dict[int, tuple[weakref.ref[Any], Figures]] = {}
        for dep, backend in self.engines():
            read[id(backend)] = (weakref.ref(backend), self._one(dep, backend.engine_metrics()))
        gone = [f for key, (ref, f) in self._read.items() if key not in read or ref() is not read[key][0]()]
        if gone:
            self._replaced = merge([self._replaced, *gone])
        self._read = read
        return merge([self._replaced, *(f for _, f in read.values())])

    def _one(self, dep: str, snap: Any) -> Figures:
        """One engine's figures from its ``engine.MetricsSnapshot``."""
        counters: dict[str, Counts] = {name: {} for name in (*COUNTERS, SCHEDULED)}
        histograms: dict[str, dict[Labels, Histogram]] = {name: {} for name in HISTOGRAMS}
        created = self._created.setdefault(dep, time.time())
        for name, (_, attr) in COUNTERS.items():
            counters[name][(dep,)] = [float(getattr(snap, attr)), created]
        for name, (_, attr) in HISTOGRAMS.items():
            h = getattr(snap, attr)
            self.bounds[name] = h.buckets
            histograms[name][(dep,)] = Histogram(list(h.counts), h.sum, created)
        for cls, fig in snap.weight_classes.items():
            counters[SCHEDULED][(dep, cls)] = [float(fig.tokens_scheduled), created]
        return Figures(counters, histograms)


def gauge_families(snaps: list[tuple[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """The answering worker's engines' live state."""
    for name, (doc, attr) in GAUGES.items():
        g = GaugeMetricFamily(name, doc, labels=LABELS)
        for dep, snap in snaps:
            g.add_metric([dep], float(getattr(snap, attr)))
        yield g
    # fair scheduling by tenant weight class (never by tenant id: per-tenant figures are on
    # ``GET /admin/v1/engine/tenants``)
    waiting = GaugeMetricFamily("switchyard_engine_waiting_by_weight_class",
                                "Sequences waiting in the engine, by the tenant weight class", labels=WEIGHT_LABELS)
    running = GaugeMetricFamily("switchyard_engine_running_by_weight_class",
                                "Sequences running in the engine, by the tenant weight class", labels=WEIGHT_LABELS)
    for dep, snap in snaps:
        for cls, fig in snap.weight_classes.items():
            waiting.add_metric([dep, cls], float(fig.num_waiting))
            running.add_metric([dep, cls], float(fig.num_running))
    yield from (waiting, running)


__all__ = ["COUNTERS", "HISTOGRAMS", "SCHEDULED", "EngineFigures", "gauge_families"]
