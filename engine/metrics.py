"""Engine metrics as plain data, for the gateway's /metrics (Prometheus-style histograms)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    """Cumulative-by-bucket on read; ``counts[i]`` observations <= ``buckets[i]`` (last: +Inf)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out

    def copy(self) -> Histogram:
        return Histogram(self.buckets, list(self.counts), self.sum, self.count)


@dataclass
class TenantFigures:
    """One tenant's (or one weight class's) standing in the engine."""

    weight: float
    num_waiting: int = 0
    num_running: int = 0
    tokens_scheduled: int = 0  # prefill and decode tokens, since the engine started


def weight_class(weight: float) -> str:
    """A weight as a short label ("1", "2", "0.5"): metrics group tenants by it, never by id."""
    return f"{weight:g}"


@dataclass
class MetricsSnapshot:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks in use, 0..1
    kv_token_utilization: float  # tokens held / slots allocated, averaged over steps
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # of which served from the cache
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    num_steps: int
    ttft: Histogram
    itl: Histogram
    e2e_latency: Histogram
    tenants: dict[str, TenantFigures] = field(default_factory=dict)  # by tenant id ("" = none given)

    @property
    def weight_classes(self) -> dict[str, TenantFigures]:
        """The tenants' figures summed by weight class (what Prometheus may label)."""
        out: dict[str, TenantFigures] = {}
        for t in self.tenants.values():
            c = out.setdefault(weight_class(t.weight), TenantFigures(t.weight))
            c.num_waiting += t.num_waiting
            c.num_running += t.num_running
            c.tokens_scheduled += t.tokens_scheduled
        return out

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass
class EngineMetrics:
    """Accumulates counters and latencies; the engine feeds it once per step."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps: int = 0
    _util_sum: float = 0.0
    _util_steps: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e_latency: Histogram = field(default_factory=Histogram)
    tenant_tokens: dict[str, int] = field(default_factory=dict)  # tokens scheduled, by tenant
    tenant_weights: dict[str, float] = field(default_factory=dict)  # the latest weight seen

    def record_scheduled(self, tenant: str, weight: float, num_tokens: int) -> None:
        self.tenant_tokens[tenant] = self.tenant_tokens.get(tenant, 0) + num_tokens
        self.tenant_weights[tenant] = weight

    def tenant_figures(self, waiting: dict[str, int], running: dict[str, int]) -> dict[str, TenantFigures]:
        names = set(self.tenant_tokens) | set(waiting) | set(running)
        return {
            t: TenantFigures(self.tenant_weights.get(t, 1.0), waiting.get(t, 0), running.get(t, 0),
                             self.tenant_tokens.get(t, 0))
            for t in sorted(names)
        }

    def record_step(self, tokens_held: int, slots_allocated: int) -> None:
        self.num_steps += 1
        if slots_allocated:
            self._util_sum += tokens_held / slots_allocated
            self._util_steps += 1

    def snapshot(
        self,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        prefix_queries: int,
        prefix_hits: int,
        num_preemptions: int,
        tenants: dict[str, TenantFigures] | None = None,
    ) -> MetricsSnapshot:
        return MetricsSnapshot(
            num_running=num_running,
            num_waiting=num_waiting,
            kv_usage=kv_usage,
            kv_token_utilization=self._util_sum / self._util_steps if self._util_steps else 0.0,
            prefix_cache_queries=prefix_queries,
            prefix_cache_hits=prefix_hits,
            num_preemptions=num_preemptions,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            num_steps=self.num_steps,
            ttft=self.ttft.copy(),
            itl=self.itl.copy(),
            e2e_latency=self.e2e_latency.copy(),
            tenants=tenants or {},
        )
