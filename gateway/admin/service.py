"""Tenant, key and limit operations on the database: one implementation for the CLI and the API.

Errors are ``AdminError`` subclasses carrying the HTTP status and OpenAI error type, so the API
turns them into error bodies and the CLI into one-line messages.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from backends.call import MAX_WEIGHT, MIN_WEIGHT
from gateway.admin.pages import MAX_LIMIT, Page, PageQuery, UnknownCursor, read_page
from gateway.auth.authenticator import ADMIN_KEY_ID
from gateway.auth.keys import generate_key, new_id
from gateway.db.engine import Database
from gateway.db.models import ApiKey, Limit, Tenant, utcnow
from gateway.db.names import hidden_character, name_key, shown
from gateway.quotas.limits import Limits


class AdminError(Exception):
    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotFound(AdminError):
    status = 404
    type = "not_found_error"


class Conflict(AdminError):
    status = 409
    type = "conflict_error"


@dataclass(frozen=True)
class TenantView:
    id: str
    name: str
    status: str
    weight: float
    created_at: datetime


@dataclass(frozen=True)
class KeyView:
    id: str
    tenant_id: str | None
    name: str
    prefix: str
    is_admin: bool
    allowed_models: list[str] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_from: str | None
    status: str  # active | revoked | expired


@dataclass(frozen=True)
class CreatedKey:
    key: KeyView
    secret: str  # shown once, never stored


def tenant_view(t: Tenant) -> TenantView:
    return TenantView(t.id, t.name, t.status, t.weight, t.created_at)


def key_view(k: ApiKey, now: datetime | None = None) -> KeyView:
    now = now or utcnow()
    status = "revoked" if k.revoked_at else "expired" if k.expires_at and k.expires_at <= now else "active"
    return KeyView(
        k.id, k.tenant_id, k.name, k.prefix, k.is_admin, k.allowed_models, k.created_at,
        k.expires_at, k.revoked_at, k.rotated_from, status,
    )  # fmt: skip


class TenancyService:
    def __init__(self, db: Database, on_change: Callable[[], None] | None = None) -> None:
        self.db = db
        self.on_change = on_change or (lambda: None)

    # ------------------------------------------------------------ tenants

    async def create_tenant(self, name: str, *, weight: float = 1.0) -> TenantView:
        name = tenant_name(name)
        check_range("weight", weight, low=MIN_WEIGHT, high=MAX_WEIGHT)
        async with self.db.session() as s:
            await _name_free(s, name)
            tenant = Tenant(id=new_id("ten"), name=name, status="active", weight=weight, created_at=utcnow())
            s.add(tenant)
            try:
                await s.commit()
            except IntegrityError:  # created at the same time
                await s.rollback()
                await _name_free(s, name)
                raise Conflict(f"a tenant named {shown(name)!r} already exists", param="name") from None
            return tenant_view(tenant)

    async def list_tenants(self, page: PageQuery = PageQuery()) -> Page[TenantView]:
        async with self.db.session() as s:
            rows, more = await _read_page(s, select(Tenant), Tenant, page)
            return Page([tenant_view(t) for t in rows], more)

    async def _tenant(self, s, ref: str, param: str = "tenant_id") -> Tenant:
        """The tenant ``ref`` names (its id, or its name up to case and Unicode form); else a 404
        naming ``param``, where the caller took it."""
        tenant = await s.get(Tenant, ref) or await s.scalar(select(Tenant).where(or_(
            Tenant.name_key == name_key(ref), and_(Tenant.name_key.is_(None), Tenant.name == ref))))
        if tenant is None:
            raise NotFound(f"no tenant {ref!r}", param=param)
        return tenant

    async def get_tenant(self, ref: str, param: str = "tenant_id") -> TenantView:
        async with self.db.session() as s:
            return tenant_view(await self._tenant(s, ref, param))

    async def update_tenant(
        self, ref: str, *, status: str | None = None, weight: float | None = None, name: str | None = None
    ) -> TenantView:
        if status is not None and status not in ("active", "disabled"):
            raise AdminError("status must be 'active' or 'disabled'", param="status")
        if weight is not None:
            check_range("weight", weight, low=MIN_WEIGHT, high=MAX_WEIGHT)
        if name is not None:
            name = tenant_name(name)
        async with self.db.session() as s:
            tenant = await self._tenant(s, ref)
            tenant_id = tenant.id  # (expired by a rollback)
            if name is not None:
                await _name_free(s, name, tenant_id)
                tenant.name = name
            if status is not None:
                tenant.status = status
            if weight is not None:
                tenant.weight = weight
            try:
                await s.commit()
            except IntegrityError:  # the name taken at the same time
                await s.rollback()
                await _name_free(s, name or "", tenant_id)
                raise Conflict(f"a tenant named {shown(name or '')!r} already exists", param="name") from None
            self.on_change()
            return tenant_view(tenant)

    # ------------------------------------------------------------ keys

    async def create_key(
        self,
        tenant: str | None,
        *,
        name: str = "",
        models: list[str] | None = None,
        expires_at: datetime | None = None,
        admin: bool = False,
    ) -> CreatedKey:
        if admin == (tenant is not None):
            raise AdminError(
                "a key needs exactly one of: a tenant (tenant key) or admin=true (admin key)", param="tenant_id"
            )
        if len(name) > MAX_NAME:
            raise AdminError(f"key name must be at most {MAX_NAME} characters, got {len(name)}", param="name")
        if models is not None and not models:  # an empty allow-list must not read as "every model"
            raise AdminError("models must name at least one model; leave it out to allow every model",
                             param="models")
        models = [m.strip() for m in models] if models else None  # " echo" would never match "echo"
        empty = next((i for i, m in enumerate(models or ()) if not m), None)
        if empty is not None:
            raise AdminError(f"models[{empty}] is empty: name a model", param=f"models[{empty}]")
        if expires_at is not None:
            expires_at = expires_at if expires_at.tzinfo else expires_at.replace(tzinfo=UTC)
            try:  # stored in UTC: an offset that pushes 9999-12-31 past the calendar is refused
                expires_at = expires_at.astimezone(UTC)
            except OverflowError:
                raise AdminError("expires_at must lie between 0001-01-01 and 9999-12-31 in UTC",
                                 param="expires_at") from None
        async with self.db.session() as s:
            tenant_id = (await self._tenant(s, tenant, "tenant_id")).id if tenant is not None else None
            material = generate_key()
            key = ApiKey(
                id=new_id("key"), tenant_id=tenant_id, name=name, prefix=material.prefix,
                key_hash=material.key_hash, is_admin=admin, allowed_models=sorted(set(models)) if models else None,
                created_at=utcnow(), expires_at=expires_at,
            )  # fmt: skip
            s.add(key)
            await s.commit()
            return CreatedKey(key_view(key), material.secret)

    async def list_keys(self, tenant: str | None = None, page: PageQuery = PageQuery()) -> Page[KeyView]:
        async with self.db.session() as s:
            query = select(ApiKey)
            if tenant is not None:
                query = query.where(ApiKey.tenant_id == (await self._tenant(s, tenant, "tenant_id")).id)
            rows, more = await _read_page(s, query, ApiKey, page)
            now = utcnow()
            return Page([key_view(k, now) for k in rows], more)

    async def _key(self, s, key_id: str) -> ApiKey:
        key = await s.get(ApiKey, key_id)
        if key is None:
            raise NotFound(f"no key {key_id!r}", param="key_id")
        return key

    async def get_key(self, key_id: str) -> KeyView:
        async with self.db.session() as s:
            return key_view(await self._key(s, key_id))

    async def check_key_filter(self, key_id: str) -> None:
        """A 404 unless ``key_id``, a filter of usage or the audit trail, names a key or the config's
        admin key (which has no row): a typo must not read as "nothing in that range"."""
        if key_id != ADMIN_KEY_ID:
            await self.get_key(key_id)

    async def revoke_key(self, key_id: str) -> KeyView:
        """Idempotent: the first revocation's time stays, even when several arrive at once (the
        write only touches a key not revoked yet, so every answer shows the time that was kept)."""
        async with self.db.session() as s:
            await s.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                            .values(revoked_at=utcnow()))
            await s.commit()
            key = await self._key(s, key_id)
            self.on_change()
            return key_view(key)

    async def rotate_key(self, key_id: str, *, grace_seconds: float = 86400) -> CreatedKey:
        """A new key with the same tenant, models, limits and expiry; the old one works for the grace
        period. A key rotated already is refused: its expiry is now its grace period's end, which
        a second new key would inherit."""
        check_range("grace_seconds", grace_seconds, high=MAX_SECONDS)
        async with self.db.session() as s:
            # Rotations of one key take turns: this no-op write holds the key's row (PostgreSQL) or
            # the database (SQLite) until the commit, so the key and its successor are read after
            # any rotation that got there first has committed, and that one's successor is named.
            await s.execute(update(ApiKey).where(ApiKey.id == key_id).values(rotated_from=ApiKey.rotated_from))
            old = await self._key(s, key_id)
            if old.revoked_at is not None:
                raise AdminError(f"key {key_id} is revoked and cannot be rotated", param="key_id")
            now = utcnow()
            if old.expires_at is not None and old.expires_at <= now:
                raise AdminError(f"key {key_id} has expired and cannot be rotated; create a new key",
                                 param="key_id")
            successor = await s.scalar(select(ApiKey.id).where(ApiKey.rotated_from == old.id).limit(1))
            if successor is not None:
                raise Conflict(f"key {key_id} was rotated already, to {successor}: rotate that key instead",
                               param="key_id")
            material = generate_key()
            new = ApiKey(
                id=new_id("key"), tenant_id=old.tenant_id, name=old.name, prefix=material.prefix,
                key_hash=material.key_hash, is_admin=old.is_admin, allowed_models=old.allowed_models,
                created_at=now, expires_at=old.expires_at, rotated_from=old.id,
            )  # fmt: skip
            grace_end = now + timedelta(seconds=grace_seconds)
            old.expires_at = grace_end if old.expires_at is None else min(old.expires_at, grace_end)
            s.add(new)
            limit = await s.scalar(select(Limit).where(Limit.scope == "key", Limit.scope_id == old.id))
            if limit is not None:
                s.add(_limit_row("key", new.id, Limits.from_row(limit)))
            await s.commit()
            self.on_change()
            return CreatedKey(key_view(new, now), material.secret)

    # ------------------------------------------------------------ limits

    async def _scope_id(self, s, scope: str, ref: str) -> str:
        if scope == "tenant":
            return (await self._tenant(s, ref)).id
        if scope == "key":
            return (await self._key(s, ref)).id
        raise AdminError("scope must be 'tenant' or 'key'", param="scope")

    async def get_limits(self, scope: str, ref: str) -> Limits:
        async with self.db.session() as s:
            sid = await self._scope_id(s, scope, ref)
            row = await s.scalar(select(Limit).where(Limit.scope == scope, Limit.scope_id == sid))
            return Limits.from_row(row) if row is not None else Limits()

    async def set_limits(self, scope: str, ref: str, limits: Limits) -> Limits:
        """Replace every limit of the scope (PUT)."""
        check_limits(limits)
        return await self._write_limits(scope, ref, limits.as_dict())

    async def update_limits(self, scope: str, ref: str, **changes: object) -> Limits:
        """Change only the given fields (None clears a limit); the others stay as they are, even
        when several updates of one scope run at once."""
        check_limits(replace(Limits(), **changes))  # type: ignore[arg-type]  # (a TypeError names an unknown field)
        if not changes:
            return await self.get_limits(scope, ref)
        return await self._write_limits(scope, ref, changes)

    async def _write_limits(self, scope: str, ref: str, values: dict[str, object]) -> Limits:
        """One statement, atomic on SQLite and PostgreSQL: insert the scope's row, or (it exists,
        or a concurrent request has just inserted it) set the given columns of it; never a
        read-modify-write that a concurrent update could overtake."""
        async with self.db.session() as s:
            sid = await self._scope_id(s, scope, ref)
            insert = (postgresql if self.db.dialect == "postgresql" else sqlite).insert(Limit)
            now = utcnow()
            statement = insert.values(scope=scope, scope_id=sid, updated_at=now, **values).on_conflict_do_update(
                index_elements=["scope", "scope_id"], set_={**values, "updated_at": now}
            ).returning(*(Limit.__table__.c[f] for f in LIMIT_FIELDS))
            row = (await s.execute(statement)).one()
            await s.commit()
        self.on_change()
        return Limits(**row._mapping)


# The largest value each number may take: it must fit its column and keep quota arithmetic
# (micro-units in Redis, sums over a period, timedelta) exact and free of overflow.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_COST_BUDGET = 1e12  # a trillion in the price unit
MAX_NAME = 200  # tenant and key names (their columns' length)
MAX_SECONDS = 100 * 365 * 86400  # a hundred years: key expiry, rotation grace
MIN_KEY_SECONDS = 1  # a key that expires sooner has expired before anyone can use it
LIMIT_FIELDS = tuple(f.name for f in fields(Limits))
LIMIT_MAX: dict[str, float] = {
    "requests_per_minute": INT32_MAX,
    "tokens_per_minute": INT32_MAX,
    "max_concurrency": INT32_MAX,
    "token_budget": INT64_MAX,
    "cost_budget": MAX_COST_BUDGET,
}


def page_query(limit: int | None, after: str | None) -> PageQuery:
    """The page a listing asks for, or a 400 naming the parameter out of range."""
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise AdminError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}", param="limit")
    if after is not None and not after:
        raise AdminError("after must be the id of the last row of the previous page", param="after")
    return PageQuery(limit, after)


async def _read_page(s: AsyncSession, query: Select[Any], model: type[Tenant | ApiKey], page: PageQuery
                     ) -> tuple[list[Any], bool]:
    try:
        return await read_page(s, query, model, page)
    except UnknownCursor:
        raise AdminError(f"after names no row of this listing: {page.after!r}", param="after") from None


# What ``new_id("ten")`` makes. A tenant is named by its id or its name, the id first: a tenant named
# like another's id could never be named by that name, and its keys would go to the other tenant.
TENANT_ID = re.compile(r"ten_[0-9a-f]{16}")


def tenant_name(name: str) -> str:
    """The name in Unicode NFKC stripped of surrounding blanks, or an AdminError unless it is
    1-200 characters, all visible (``gateway.db.names``), and not shaped like a tenant id."""
    name = unicodedata.normalize("NFKC", name).strip()
    if not name or len(name) > MAX_NAME:
        raise AdminError(f"tenant name must be 1-{MAX_NAME} characters", param="name")
    if (hidden := hidden_character(name)) is not None:
        raise AdminError(f"tenant name holds U+{ord(hidden):04X} ({unicodedata.name(hidden, 'unnamed')}), a "
                         "character that does not show: names must be visible text", param="name")
    if TENANT_ID.fullmatch(name_key(name)):  # in any case: names differing in case are one name
        raise AdminError(f"tenant name {name!r} has the form of a tenant id (ten_ and 16 hex digits): choose "
                         "another name", param="name")
    return name


async def _name_free(s: AsyncSession, name: str, tenant_id: str | None = None) -> None:
    """A Conflict naming the tenant other than ``tenant_id`` whose name is ``name`` up to case and
    Unicode form."""
    other = await s.scalar(select(Tenant).where(Tenant.name_key == name_key(name), Tenant.id != tenant_id))
    if other is not None:
        raise Conflict(f"a tenant named {shown(other.name)!r} already exists ({other.id}): names that differ only "
                       "in case, width or other Unicode form are one name", param="name")


def check_range(field: str, value: float, *, low: float = 0, high: float, low_open: bool = False) -> None:
    """An AdminError naming ``field`` and the allowed range unless ``low <= value <= high`` (finite)."""
    ok = (value > low if low_open else value >= low) and value <= high and math.isfinite(value)
    if not ok:
        bracket = "(" if low_open else "["
        raise AdminError(f"{field} must lie in {bracket}{bound(low)}, {bound(high)}], got {value!r}", param=field)


def bound(value: float) -> str:
    """A range's end as written: a whole number in full (2147483647, not 2.14748e+09)."""
    return str(int(value)) if math.isfinite(value) and float(value).is_integer() else f"{value:g}"


BUDGET_PERIODS = ("day", "month", "total")


def check_limits(limits: Limits) -> None:
    for field, value in limits.as_dict().items():
        if field == "budget_period":
            if value not in BUDGET_PERIODS:
                raise AdminError("budget_period must be day, month or total", param="budget_period")
        elif value is not None:
            check_range(field, value, high=LIMIT_MAX[field])  # type: ignore[arg-type]


def _limit_row(scope: str, scope_id: str, limits: Limits) -> Limit:
    return Limit(scope=scope, scope_id=scope_id, updated_at=utcnow(), **limits.as_dict())
