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
        )
