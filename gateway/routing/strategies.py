"""Strategies: the order in which a group's deployments are tried for one request.

Each returns every candidate, best first; the plan takes the first and falls back along the rest.
``key`` is the request's routing key (its prompt's opening); only ``cache_aware`` reads it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from gateway.routing.cache_aware import cache_aware
from gateway.routing.deployment import Deployment

EXPLORATION = 0.1  # lowest_latency: share of requests sent in random order, to keep estimates fresh

Strategy = Callable[[Sequence[Deployment], random.Random, str | None], list[Deployment]]


def weighted(candidates: Sequence[Deployment], rng: random.Random, key: str | None = None) -> list[Deployment]:
    """Weighted random order without replacement (the first is a weighted pick)."""
    # Efraimidis-Spirakis: sort by u^(1/w), u uniform in (0, 1], compared as its logarithm, log(u)/w:
    # u^(1/w) itself underflows to 0.0 for small weights (0.001 and below), and ties go to the first listed.
    return sorted(candidates, key=lambda d: math.log(1.0 - rng.random()) / d.config.weight, reverse=True)


def least_busy(candidates: Sequence[Deployment], rng: random.Random, key: str | None = None) -> list[Deployment]:
    """Fewest outstanding requests (``in_flight``, queued ones included) per unit of weight; then
    fewer of them queued; then the emptier KV cache (engine deployments report it); remaining ties
    broken at random."""

    def load(d: Deployment) -> tuple[float, int, float, float]:
        stats = d.backend.stats()
        return (stats.in_flight / d.config.weight, stats.queue_depth, stats.kv_cache_usage or 0.0, rng.random())

    return sorted(candidates, key=load)


def lowest_latency(candidates: Sequence[Deployment], rng: random.Random, key: str | None = None) -> list[Deployment]:
    """Lowest time-to-first-token EWMA; unmeasured deployments first, and some random exploration."""
    if rng.random() < EXPLORATION:
        shuffled = list(candidates)
        rng.shuffle(shuffled)
        return shuffled

    def latency(d: Deployment) -> tuple[float, float]:
        ewma = d.health.latency_ewma
        return (-1.0 if ewma is None else ewma, rng.random())

    return sorted(candidates, key=latency)


def priority(candidates: Sequence[Deployment], rng: random.Random, key: str | None = None) -> list[Deployment]:
    """The configured order (list the cheapest first)."""
    return list(candidates)


STRATEGIES: dict[str, Strategy] = {
    "weighted": weighted,
    "least_busy": least_busy,
    "lowest_latency": lowest_latency,
    "priority": priority,
    "cache_aware": cache_aware,  # prefix-keyed consistent hashing with a load cap (gateway.routing.cache_aware)
}
