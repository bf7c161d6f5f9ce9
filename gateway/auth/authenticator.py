"""The SQL-backed Authenticator: bearer token -> hash -> key row -> Principal.

Lookups are cached in process (``gateway.caching``) for ``ttl`` seconds (at most 5), so a
revocation or a disabled tenant is seen by every replica within that time. Expiry is checked on
every call against the cached expiry time, so it is exact. Unknown tokens are cached too
(bounded), which keeps a flood of bad keys off the database. The cache is keyed by the hash, never
the key. While the database is unreachable, entries up to ``stale_grace`` seconds old keep
answering (nothing can be revoked meanwhile); beyond that the error propagates and the request
fails with 503.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select

from gateway.auth.keys import hash_key, looks_like_key, same_hash
from gateway.caching import RefreshingCache
from gateway.contracts import Principal
from gateway.db.engine import Database
from gateway.db.models import ApiKey, Tenant

ADMIN_KEY_ID = "admin:config"  # the principal id of the bootstrap admin key from settings


@dataclass(frozen=True)
class _Entry:
    principal: Principal | None
    expires_at: float | None  # unix time the key stops working, None: never


class SqlAuthenticator:
    def __init__(
        self,
        db: Database,
        *,
        ttl: float = 2.0,
        admin_key: str | None = None,
        max_entries: int = 10_000,
        stale_grace: float = 300.0,
    ) -> None:
        self.db = db
        self.admin_key = admin_key
        self._admin_digest = hash_key(admin_key) if admin_key else None
        self._cache: RefreshingCache[str, _Entry] = RefreshingCache(
            min(ttl, 5.0), stale_grace=stale_grace, max_entries=max_entries, name="api keys")

    async def authenticate(self, token: str) -> Principal | None:
        digest = hash_key(token)  # once: compared with the admin key's, then looked up
        if self._admin_digest is not None and same_hash(digest, self._admin_digest):
            return Principal(key_id=ADMIN_KEY_ID, tenant_id=None, is_admin=True)
        if not looks_like_key(token):
            return None
        entry = await self._cache.get(digest, lambda: self._load(digest))
        if entry.expires_at is not None and time.time() >= entry.expires_at:
            return None
        return entry.principal

    def invalidate(self) -> None:
        """Forget everything cached (this process's admin operations call it)."""
        self._cache.clear()

    async def _load(self, digest: str) -> _Entry:
        query = (
            select(ApiKey, Tenant)
            .outerjoin(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.key_hash == digest)
        )
        async with self.db.session() as session:
            row = (await session.execute(query)).first()
        if row is None:
            return _Entry(None, None)
        key, tenant = row
        if not same_hash(key.key_hash, digest) or key.revoked_at is not None:
            return _Entry(None, None)
        if not key.is_admin and (tenant is None or tenant.status != "active"):
            return _Entry(None, None)
        principal = Principal(
            key_id=key.id,
            tenant_id=None if key.is_admin else key.tenant_id,
            is_admin=key.is_admin,
            allowed_models=frozenset(key.allowed_models) if key.allowed_models else None,
            tenant_weight=tenant.weight if tenant is not None else 1.0,
        )
        expires = key.expires_at.timestamp() if key.expires_at else None
        return _Entry(principal, expires)
