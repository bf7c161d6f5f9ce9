"""Latency and time-to-first-token buckets of the rollups (``latency_hourly``, ``latency_daily``).

Buckets grow geometrically: bucket 0 holds everything up to MIN_MS, bucket i > 0 holds
(MIN_MS * GROWTH**(i-1), MIN_MS * GROWTH**i]. A bucket's geometric midpoint is within
sqrt(GROWTH) - 1 (3.9 %) of any value in it, so percentiles read from the rollup are that close to
the exact ones; 0.1 ms .. 1 h spans about 220 buckets, of which a model's hour uses a few dozen
(finer buckets cost rows: a month's percentiles read every hour's used buckets). PostgreSQL
computes the same numbers in SQL (``pg_bulk``).
"""

from __future__ import annotations

import math

MIN_MS = 0.1
GROWTH = 1.08


def bucket_of(ms: float) -> int:
    if ms <= MIN_MS:
        return 0
    return max(1, math.ceil(math.log(ms / MIN_MS) / math.log(GROWTH) - 1e-9))


def bucket_value(bucket: int) -> float:
    """The value a bucket stands for: its geometric midpoint (MIN_MS for bucket 0)."""
    return MIN_MS if bucket <= 0 else MIN_MS * GROWTH ** (bucket - 0.5)
