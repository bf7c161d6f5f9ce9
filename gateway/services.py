"""The app's assembly root: the services a running app uses, behind the protocols of
``gateway.contracts``, built from settings in this one place.

``build_services(settings)`` assembles them: SQL-backed API keys (plus the bootstrap admin key),
quotas (Redis or in-process), the batched usage writer, the admin API and dashboards (``Tenancy``),
and the routing table's backends. ``gateway.app.create_app`` mounts them; ``start``/``aclose``
run in the app's lifespan (uvicorn calls the shutdown half on SIGTERM, which flushes the usage
buffer). An engine node (``gateway.engine_node``) builds its own, tenancy-free set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litestar import Router as HttpRouter
from sqlalchemy import select, text
from sqlalchemy.dialects import postgresql, sqlite

from backends.factory import build_backend
from gateway.admin.api import admin_routers
from gateway.admin.service import TenancyService
from gateway.auth.audit import AuditLog
from gateway.auth.authenticator import SqlAuthenticator
from gateway.auth.guard import AuthGuard
from gateway.auth.keys import hash_key
from gateway.auth.throttle import AuthThrottle, FailureCounts, MemoryFailures
from gateway.auth.throttle_redis import RedisFailures
from gateway.contracts import Admission, Authenticator, UsageSink
from gateway.dashboard.pages import dashboard_router
from gateway.dashboard.sessions import Sessions
from gateway.db.engine import Database
from gateway.db.migrate import SchemaNotReady, check_schema
from gateway.db.models import ModelPrice, utcnow
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import LimitsSource
from gateway.quotas.redis_credit import RedisCredit
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import MemoryStore, QuotaStore
from gateway.routing.router import Router
from gateway.settings import ConfigError, Settings
from gateway.stored_responses import ResponseStore
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter

log = logging.getLogger("switchyard.services")

ReadinessCheck = Callable[[], Awaitable[bool]]


@dataclass
class Services:
    authenticator: Authenticator
    admission: Admission
    usage: UsageSink
    router: Router
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)  # name -> check, for /readyz
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at shutdown, reversed
    starters: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at app start-up
    routes: list[Any] = field(default_factory=list)  # extra route handlers / Routers the app mounts
    responses: ResponseStore | None = None  # kept Responses API answers; None: nothing is stored
    # Engine nodes: take the tenant a gateway forwards (backends.call headers) for principals without one.
    tenant_from_headers: bool = False
    auth_guard: AuthGuard | None = None  # throttles failed authentications and audits key use; None: neither
    # Called (in the event loop, without awaiting) with the new settings after a config reload
    # (gateway.reload) has swapped the routing table: what else must see the new models and prices.
    on_reload: list[Callable[[Settings], None]] = field(default_factory=list)

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            try:
                await close()
            except Exception:
                log.exception("error while closing a service")
        await self.router.aclose()


@dataclass
class Tenancy:
    db: Database
    authenticator: SqlAuthenticator
    admission: QuotaAdmission
    usage: UsageWriter
    service: TenancyService
    prices: PriceTable
    guard: AuthGuard
    sessions: Sessions | None = None  # dashboard sign-ins; None: no /dashboard
    _syncing: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)  # after a reload

    @classmethod
    def from_settings(cls, settings: Settings) -> Tenancy:
        db = Database.from_url(settings.database.url)
        ttl = settings.auth.key_cache_seconds
        authenticator = SqlAuthenticator(db, ttl=ttl, admin_key=settings.auth.admin_key)
        limits = LimitsSource(db, ttl=ttl)
        redis = connect_redis(settings.redis.url) if settings.redis.url else None
        store: QuotaStore = RedisStore(redis, prefix="sy:q") if redis else MemoryStore()
        failures: FailureCounts = RedisFailures(redis) if redis else MemoryFailures()
        auth = settings.auth
        throttle = AuthThrottle(failures, per_address=auth.max_failures_per_address,
                                per_prefix=auth.max_failures_per_prefix, window=auth.failure_window)
        journal = _journal_dir(settings)
        audit = AuditLog(db, key_use_interval=auth.key_use_audit_seconds, retention=auth.audit_retention_days * 86400,
                         spill_dir=journal)
        guard = AuthGuard(throttle, audit)
        prices = PriceTable.from_settings(settings)
        credit = RedisCredit(store) if isinstance(store, RedisStore) and settings.quotas.credit else None
        usage = UsageWriter(db, prices, journal_dir=journal,
                            sync_before_reply=settings.usage.sync_before_reply,
                            fsync_interval=settings.usage.fsync_interval_ms / 1000)
        admission = QuotaAdmission(store, limits, prices, on_unavailable=settings.redis.on_unavailable,
                                   lease_seconds=settings.quotas.lease_seconds, credit=credit,
                                   flush_records=usage.flush)

        def changed() -> None:  # this process sees admin changes at once; other replicas within the TTL
            authenticator.invalidate()
            limits.invalidate()

        dash = settings.dashboard
        sessions = (
            Sessions.create(dash.session_secret, dash.session_seconds, dash.secure_cookies,
                            hash_key(settings.auth.admin_key) if settings.auth.admin_key else None)
            if dash.enabled else None
        )
        service = TenancyService(db, on_change=changed)
        return cls(db, authenticator, admission, usage, service, prices, guard, sessions)

    def routers(self) -> list[HttpRouter]:
        routers = admin_routers(self.service, self.db, self.authenticator)
        if self.sessions is not None:
            routers.append(dashboard_router(self.service, self.db, self.authenticator, self.sessions, self.guard))
        return routers

    async def start(self) -> None:
        """Refuse to run on a database this version cannot run on; load prices; start the usage writer."""
        try:
            schema = await check_schema(self.db.engine)
        except SchemaNotReady as exc:
            log.error("%s", exc)  # the one line an operator needs, before the start-up traceback
            raise
        if schema.newer:  # an older replica during a rolling upgrade
            log.warning("database schema %s is newer than this version's %s and records that it may run on it",
                        schema.current, schema.head)
        await self._sync_prices()
        self.usage.start()
        self.guard.audit.start()
        self.admission.start()
        if isinstance(counts := self.guard.throttle.counts, RedisFailures):
            counts.start()

    def reload_prices(self, fresh: Settings) -> None:
        """After a config reload: the new prices take effect at once for admission (the money a
        request reserves) and metering (the cost of each usage record), which share this one
        table, and are written to model_prices in the background, as at start-up. A model the new
        config no longer prices keeps its last price, as it would from model_prices after a restart."""
        self.prices.update(PriceTable.from_settings(fresh).prices)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a caller outside the event loop: model_prices is written at the next start
            return
        task = loop.create_task(self._sync_reloaded(), name="sync-prices")
        self._syncing.add(task)
        task.add_done_callback(self._syncing.discard)

    async def _sync_reloaded(self) -> None:
        try:
            await self._sync_prices()
        except Exception as exc:  # the prices are in effect; only reports miss them until the next start
            log.error("writing the reloaded prices to model_prices failed: %s: %s", type(exc).__name__, exc)

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
        checks: dict[str, Callable[[], Awaitable[bool]]] = {"database": self.ready}
        store = self.admission.store
        if isinstance(store, RedisStore) and self.admission.on_unavailable == "fail_closed":
            checks["redis"] = store.ready
        return checks

    async def aclose(self) -> None:
        if self._syncing:
            await asyncio.wait(list(self._syncing), timeout=10)
        if isinstance(counts := self.guard.throttle.counts, RedisFailures):
            await counts.aclose()
        await self.admission.aclose()
        await asyncio.gather(self.usage.aclose(), self.guard.audit.aclose())  # each waits 10 s at most for SQL
        store = self.admission.store
        if isinstance(store, RedisStore):
            await store.redis.aclose()
        await self.db.dispose()


def _journal_dir(settings: Settings) -> Path:
    """``usage.journal_dir``, made if missing: one that cannot be is a config error naming the key, at
    start-up, not a worker's failure to start with "no such file"."""
    path = Path(settings.usage.journal_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"config error at usage.journal_dir: cannot use {path} as a folder "
                          f"({exc.strerror or exc})") from None
    return path


def build_services(settings: Settings) -> Services:
    tenancy = Tenancy.from_settings(settings)  # SQL keys, quotas, metering, admin API, dashboards
    return Services(
        authenticator=tenancy.authenticator,
        admission=tenancy.admission,
        usage=tenancy.usage,
        router=Router.from_settings(settings, build_backend),
        readiness=tenancy.readiness(),
        closers=[tenancy.aclose],
        starters=[tenancy.start],
        routes=tenancy.routers(),
        responses=ResponseStore(tenancy.db),
        auth_guard=tenancy.guard,
        on_reload=[tenancy.reload_prices],
    )
