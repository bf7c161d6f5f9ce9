"""Admission control: requests/min, tokens/min, concurrency and budgets, in Redis or in process."""

from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource, Scope
from gateway.quotas.redis_store import RedisStore
from gateway.quotas.store import MemoryStore, QuotaStore

__all__ = ["Limits", "LimitsSource", "MemoryStore", "QuotaAdmission", "QuotaStore", "RedisStore", "Scope"]
