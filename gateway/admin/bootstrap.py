"""First start of the embedded default: migrate, then create a default tenant and key once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select

from gateway.admin.service import NotFound, TenancyService
from gateway.db import migrate
from gateway.db.engine import Database
from gateway.db.models import ApiKey

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class BootstrapResult:
    created: bool
    tenant_id: str | None = None
    key_id: str | None = None
    secret: str | None = None  # shown once; only its hash is stored


async def bootstrap(url: str, progress: Callable[[str], None] | None = None) -> BootstrapResult:
    """Migrate ``url`` to head; if it holds no tenant key yet, create tenant "default" and a key."""
    await asyncio.to_thread(migrate.upgrade, url, "head", progress)
    db = Database.from_url(url)
    try:
        async with db.session() as s:
            keys = await s.scalar(select(func.count()).select_from(ApiKey).where(ApiKey.tenant_id.is_not(None)))
        if keys:
            return BootstrapResult(created=False)
        svc = TenancyService(db)
        try:  # by its name as names are compared: "Default", made before, is the one (a second would conflict)
            tenant = await svc.get_tenant(DEFAULT_TENANT)
        except NotFound:
            tenant = await svc.create_tenant(DEFAULT_TENANT)
        created = await svc.create_key(tenant.id, name="default")
        return BootstrapResult(True, tenant.id, created.key.id, created.secret)
    finally:
        await db.dispose()
