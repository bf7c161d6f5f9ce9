"""The SQL data model: tenants, API keys, limits, usage records and model prices.

Identifiers are short public strings (``ten_…``, ``key_…``) so they can appear in URLs, logs and
usage rows; secrets never do (keys are stored as a SHA-256 hash plus a short visible prefix).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, validates
from sqlalchemy.types import TypeDecorator

from gateway.db.names import name_key

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


BigId = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only INTEGER keys
BigCount = BigInteger().with_variant(Integer, "sqlite")  # SQLite's INTEGER holds 64 bits: as its migrations made it


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # the name as names are compared (gateway.db.names): one tenant per name up to case and Unicode form
    # (None: created by a version before 0016, during a rolling upgrade)
    name_key: Mapped[str | None] = mapped_column(Text, unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | disabled
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    @validates("name")
    def _keyed(self, _: str, name: str) -> str:
        """Setting the name sets its key."""
        self.name_key = name_key(name)
        return name


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str | None] = mapped_column(
        String(40), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    rotated_from: Mapped[str | None] = mapped_column(String(40), default=None)


class Limit(Base):
    """Quotas for one tenant or one key; a missing field means "no limit"."""

    __tablename__ = "limits"
    __table_args__ = (UniqueConstraint("scope", "scope_id", name="uq_limits_scope"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(8))  # tenant | key
    scope_id: Mapped[str] = mapped_column(String(40))
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, default=None)
    token_budget: Mapped[int | None] = mapped_column(BigInteger, default=None)
    cost_budget: Mapped[float | None] = mapped_column(Float, default=None)  # USD
    budget_period: Mapped[str] = mapped_column(String(8), default="month")  # day | month | total
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class UsageRow(Base):
    """One row per request, successful or not; ``request_id`` makes writes idempotent."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_tenant_started", "tenant_id", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str | None] = mapped_column(String(40))
    key_id: Mapped[str] = mapped_column(String(40), index=True)
    model: Mapped[str] = mapped_column(String(200))
    deployment: Mapped[str | None] = mapped_column(String(200))
    provider: Mapped[str | None] = mapped_column(String(40))
    endpoint: Mapped[str] = mapped_column(String(40))
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    # an upstream's counts have no bound: 64 bits (0012; SQLite's INTEGER always was)
    prompt_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    exact: Mapped[bool] = mapped_column(Boolean, default=True)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[int] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(64))
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    service_tier: Mapped[str | None] = mapped_column(String(40))  # as the provider named it
    upstream_request_id: Mapped[str | None] = mapped_column(String(128))  # the provider's id of its answer


class ModelPrice(Base):
    """USD per million tokens for a public model name (set by config, or by the admin API)."""

    __tablename__ = "model_prices"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    input_per_million: Mapped[float] = mapped_column(Float, default=0.0)
    output_per_million: Mapped[float] = mapped_column(Float, default=0.0)
    cached_input_per_million: Mapped[float | None] = mapped_column(Float, default=None)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class UsageHourly(Base):
    """Usage summed per tenant, key, model, UTC hour and error type ("" for none), kept up to date by
    the usage writer in the transaction that inserts the records. The dashboards read only this."""

    __tablename__ = "usage_hourly"
    __table_args__ = (Index("ix_usage_hourly_tenant_hour", "tenant_id", "hour"),)

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "" for admin keys
    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    error_type: Mapped[str] = mapped_column(String(64), primary_key=True)  # "" for a success
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)  # status >= 400
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    latency_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)


class LatencyHourly(Base):
    """Per tenant, model and UTC hour: how many requests fell in each latency / TTFT bucket
    (``gateway.usage.buckets.bucket_of``), so percentiles come from the rollup too."""

    __tablename__ = "latency_hourly"
    __table_args__ = (Index("ix_latency_hourly_tenant_hour", "tenant_id", "hour"),)

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)  # latency | ttft
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)  # see gateway.usage.buckets.bucket_of
    count: Mapped[int] = mapped_column(BigInteger, default=0)


class LatencyDaily(Base):
    """``LatencyHourly`` summed per UTC day, so a month's percentiles read 30 days, not 720 hours."""

    __tablename__ = "latency_daily"

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    day: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)  # UTC midnight
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)


class StoredResponse(Base):
    """A Responses API answer kept for ``GET /v1/responses/{id}`` and ``previous_response_id``.

    ``owner`` is the tenant id (``key:<id>`` for keys without a tenant); every read filters on it. A
    deleted response's row stays, emptied, owned by ``deleted`` (``gateway.stored_responses``).
    ``context`` holds the whole conversation up to and including this answer's output, as Responses
    items, so a continuation never depends on an earlier response still being stored."""

    __tablename__ = "stored_responses"
    __table_args__ = (
        Index("ix_stored_responses_owner_created", "owner", "created_at"),
        Index("ix_stored_responses_unsettled", "id", postgresql_where=text("unsettled IS NOT NULL"),
              sqlite_where=text("unsettled IS NOT NULL")),
    )

    # response ids are of any length (an upstream serving Responses mints its own: 0013)
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    owner: Mapped[str] = mapped_column(String(48))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    model: Mapped[str] = mapped_column(String(200))
    previous_response_id: Mapped[str | None] = mapped_column(Text, default=None)
    # the conversation began by continuing a response only the upstream holds: that response's id
    upstream_previous_id: Mapped[str | None] = mapped_column(Text, default=None)
    # the deployment serving Responses that answered (its own id), which ``GET``/``cancel`` reach while
    # it is not finished (``background``: 0014); NULL for a translated answer
    deployment: Mapped[str | None] = mapped_column(Text, default=None)
    input_items: Mapped[list[Any]] = mapped_column(JSON)
    context: Mapped[list[Any]] = mapped_column(JSON)
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    # a background response whose spend is not metered yet: who started it and what its usage row
    # needs (``gateway.held_usage``); NULL once metered (0015)
    unsettled: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), default=None)
    # while a caller meters it: until when (epoch seconds) its claim holds; one whose meterer died is
    # claimed again once it has passed (0017)
    metering_until: Mapped[float | None] = mapped_column(Float, default=None)


class AuthEvent(Base):
    """The audit trail of sign-ins and key use: who (key, tenant, or the prefix of a key that did
    not match), when, from where (client address), what happened (``gateway.auth.audit.EVENTS``)."""

    __tablename__ = "auth_events"
    __table_args__ = (Index("ix_auth_events_at", "at"), Index("ix_auth_events_key_at", "key_id", "at"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    event: Mapped[str] = mapped_column(String(24))
    client: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str | None] = mapped_column(String(40), default=None)
    tenant_id: Mapped[str | None] = mapped_column(String(40), default=None)
    key_prefix: Mapped[str | None] = mapped_column(String(16), default=None)
    surface: Mapped[str] = mapped_column(String(16))  # api | admin | dashboard


class RevokedSession(Base):
    """Dashboard sessions ended before their cookie expires (sign-out), checked on every dashboard
    request by every replica; rows are useless after ``expires_at`` and pruned then."""

    __tablename__ = "revoked_sessions"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class SchemaCompatibility(Base):
    """One row, rewritten by every migration run (``gateway.db.schema_compat``): the database's
    revision and the oldest revision whose code may still run on it, so that during a rolling
    upgrade a replica of the previous version restarts on the migrated schema instead of refusing it."""

    __tablename__ = "schema_compatibility"

    revision: Mapped[str] = mapped_column(String(64), primary_key=True)
    oldest_revision: Mapped[str] = mapped_column(String(64))
