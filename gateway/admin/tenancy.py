"""Everything issue 3 adds to a running gateway, built from settings in one place.

``build_services`` takes the authenticator, admission and usage sink from here; the app factory
mounts ``routers``; ``start``/``aclose`` run in the app's lifespan (uvicorn calls the shutdown half
on SIGTERM, which flushes the usage buffer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from litestar import Router
from sqlalchemy import select, text
from sqlalchemy.dialects import postgresql, sqlite

from gateway.admin.api import admin_routers
from gateway.admin.service import TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.dashboard.pages import dashboard_router
from gateway.dashboard.sessions import Sessions
from gateway.db.engine import Database
from gateway.db.migrate import SchemaNotReady, check_schema
from gateway.db.models import ModelPrice, utcnow
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import MemoryStore, QuotaStore
from gateway.settings import Settings
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter

log = logging.getLogger("switchyard.tenancy")

@dataclass
class Tenancy:
    db: Database
    authenticator: SqlAuthenticator
    admission: QuotaAdmission
    usage: UsageWriter
    service: TenancyService
    prices: PriceTable
    sessions: Sessions | None = None  # dashboard sign-ins; None: no /dashboard

    @classmethod
    def from_settings(cls, settings: Settings) -> Tenancy:
        db = Database.from_url(settings.database.url)
        ttl = settings.auth.key_cache_seconds
        authenticator = SqlAuthenticator(db, ttl=ttl, admin_key=settings.auth.admin_key)
        limits = LimitsSource(db, ttl=ttl)
        store: QuotaStore = (
            RedisStore(connect_redis(settings.redis.url), prefix="sy:q") if settings.redis.url else MemoryStore()
        )
        prices = PriceTable.from_settings(settings)
        admission = QuotaAdmission(store, limits, prices, on_unavailable=settings.redis.on_unavailable)
        usage = UsageWriter(db, prices, journal_dir=Path(settings.usage.journal_dir))

        def changed() -> None:  # this process sees admin changes at once; other replicas within the TTL
            authenticator.invalidate()
            limits.invalidate()

        dash = settings.dashboard
        sessions = Sessions.create(dash.session_secret, dash.session_seconds, dash.secure_cookies) if dash.enabled else None
        return cls(db, authenticator, admission, usage, TenancyService(db, on_change=changed), prices, sessions)

    def routers(self) -> list[Router]:
        routers = admin_routers(self.service, self.db, self.authenticator)
        if self.sessions is not None:
            routers.append(dashboard_router(self.service, self.db, self.authenticator, self.sessions))
        return routers

    async def start(self) -> None:
        """Refuse to run on an un-migrated database; load prices; start the usage writer."""
        try:
            await check_schema(self.db.engine)
        except SchemaNotReady as exc:
            log.error("%s", exc)  # the one line an operator needs, before the start-up traceback
            raise
        await self._sync_prices()
        self.usage.start()

    async def _sync_prices(self) -> None:
        """The config's prices are written to model_prices (so reports and dashboards can read
        them); prices stored there for models the config does not name are used as well."""
        rows_in = [
            {"model": m, "input_per_million": p.input_per_million, "output_per_million": p.output_per_million,
             "cached_input_per_million": p.cached_input_per_million, "updated_at": utcnow()}
            for m, p in self.prices.prices.items()
        ]  # fmt: skip
        async with self.db.session() as s:
            if rows_in:  # an upsert: replicas starting together must not collide
                insert = (postgresql if self.db.dialect == "postgresql" else sqlite).insert(ModelPrice)
                columns = ("input_per_million", "output_per_million", "cached_input_per_million", "updated_at")
                upsert = insert.on_conflict_do_update(
                    index_elements=["model"], set_={c: getattr(insert.excluded, c) for c in columns}
                )
                await s.execute(upsert, rows_in)
                await s.commit()
            rows = (await s.scalars(select(ModelPrice))).all()
        stored = {r.model: Price(r.input_per_million, r.output_per_million, r.cached_input_per_million) for r in rows}
        self.prices.update({m: p for m, p in stored.items() if m not in self.prices.prices})

    async def ready(self) -> bool:
        """The database answers (for /readyz)."""
        async with self.db.engine.connect() as conn:
            await conn.execute(text("select 1"))
        return True

    def readiness(self) -> dict[str, Callable[[], Awaitable[bool]]]:
        """What /readyz checks: the database, and Redis when requests cannot be served without it
        (``fail_closed``; under ``fail_open`` a Redis outage admits without counting)."""
        checks = {"database": self.ready}
        store = self.admission.store
        if isinstance(store, RedisStore) and self.admission.on_unavailable == "fail_closed":
            checks["redis"] = store.ready
        return checks

    async def aclose(self) -> None:
        await self.usage.aclose()
        store = self.admission.store
        if isinstance(store, RedisStore):
            await store.redis.aclose()
        await self.db.dispose()
