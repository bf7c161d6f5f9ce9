"""API keys and the SQL authenticator, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from gateway.admin.service import AdminError, TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.auth.keys import KEY_PREFIX, generate_key, hash_key
from gateway.db import Database
from gateway.db.models import ApiKey
from gateway.quotas.limits import Limits
from tests.gateway.tenancy_fixtures import db  # noqa: F401


async def eventually_rejected(auth: SqlAuthenticator, secret: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await auth.authenticate(secret) is None:
            return True
        await asyncio.sleep(0.1)
    return False


def test_key_material() -> None:
    keys = {generate_key().secret for _ in range(100)}
    assert len(keys) == 100
    k = generate_key()
    assert k.secret.startswith(KEY_PREFIX) and len(k.secret) - len(KEY_PREFIX) >= 43  # 32 random bytes
    assert k.key_hash == hash_key(k.secret) and len(k.key_hash) == 64
    assert k.prefix == k.secret[:12] and k.secret not in k.key_hash


async def test_only_the_hash_is_stored(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("hash-only")
    created = await svc.create_key(tenant.id)
    async with db.session() as s:
        row = await s.get(ApiKey, created.key.id)
        assert row is not None and row.key_hash == hash_key(created.secret)
        dump = " ".join(str(v) for v in (await s.execute(text("select * from api_keys"))).all())
    assert created.secret not in dump


async def test_lifecycle_revoke_seen_within_5s_by_another_replica(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("lifecycle", weight=2.5)
    created = await svc.create_key(tenant.id, models=["m1", "m2"])
    replica = SqlAuthenticator(db, ttl=2.0)  # another gateway process: nobody invalidates its cache
    p = await replica.authenticate(created.secret)
    assert p is not None and p.tenant_id == tenant.id and p.key_id == created.key.id and not p.is_admin
    assert p.may_use("m1") and not p.may_use("other") and p.tenant_weight == 2.5
    await svc.revoke_key(created.key.id)
    assert await eventually_rejected(replica, created.secret)


async def test_disabled_tenant_keys_stop(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("to-disable")
    created = await svc.create_key(tenant.id)
    auth = SqlAuthenticator(db, ttl=1.0)
    assert await auth.authenticate(created.secret) is not None
    await svc.update_tenant(tenant.id, status="disabled")
    assert await eventually_rejected(auth, created.secret)
    await svc.update_tenant(tenant.id, status="active")
    await asyncio.sleep(1.0)
    assert await auth.authenticate(created.secret) is not None


async def test_expiry_is_exact_even_when_cached(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("expiry")
    soon = await svc.create_key(tenant.id, expires_at=datetime.now(UTC) + timedelta(seconds=2))
    past = await svc.create_key(tenant.id, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    auth = SqlAuthenticator(db, ttl=5.0)
    assert await auth.authenticate(soon.secret) is not None
    assert await auth.authenticate(past.secret) is None
    await asyncio.sleep(2.1)
    assert await auth.authenticate(soon.secret) is None  # cached entry, but its expiry has passed
    assert (await svc.get_key(soon.key.id)).status == "expired"


async def test_rotation_keeps_old_key_for_the_grace_period(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("rotation")
    old = await svc.create_key(tenant.id, models=["m1"])
    await svc.set_limits("key", old.key.id, Limits(requests_per_minute=7))
    auth = SqlAuthenticator(db, ttl=0.0)
    new = await svc.rotate_key(old.key.id, grace_seconds=2)
    assert new.secret != old.secret and new.key.rotated_from == old.key.id
    assert (await svc.get_limits("key", new.key.id)).requests_per_minute == 7
    p_new, p_old = await auth.authenticate(new.secret), await auth.authenticate(old.secret)
    assert p_new is not None and p_old is not None and p_new.allowed_models == frozenset({"m1"})
    await asyncio.sleep(2.1)
    assert await auth.authenticate(old.secret) is None
    assert await auth.authenticate(new.secret) is not None



async def test_rotation_never_hands_out_a_key_that_is_dead_or_dying(db: Database) -> None:
    """An expired key is not rotated (the new key would inherit its past expiry), nor is a key
    rotated already (in its grace period: the new key would inherit the grace period's end)."""
    svc = TenancyService(db)
    tenant = await svc.create_tenant(f"rotation-{time.time_ns()}")
    expired = await svc.create_key(tenant.id, expires_at=datetime.now(UTC) - timedelta(days=1))
    with pytest.raises(AdminError, match="expired") as refused:
        await svc.rotate_key(expired.key.id)
    assert refused.value.param == "key_id" and refused.value.status == 400
    old = await svc.create_key(tenant.id)
    new = await svc.rotate_key(old.key.id, grace_seconds=60)
    assert new.key.expires_at is None
    with pytest.raises(AdminError, match=new.key.id) as refused:
        await svc.rotate_key(old.key.id, grace_seconds=60)  # a second rotation of the key in its grace
    assert refused.value.param == "key_id" and refused.value.status == 409
    assert (await svc.rotate_key(new.key.id)).key.expires_at is None  # the newest key of the chain rotates

async def test_concurrent_rotations_of_a_key_make_one_successor(db: Database) -> None:
    """Rotations of one key at once: one succeeds, every other is a 409 naming its successor."""
    svc = TenancyService(db)
    tenant = await svc.create_tenant(f"race-{time.time_ns()}")
    for _ in range(3):
        old = await svc.create_key(tenant.id)
        done = await asyncio.gather(*(svc.rotate_key(old.key.id, grace_seconds=60) for _ in range(4)),
                                    return_exceptions=True)
        made = [d for d in done if not isinstance(d, BaseException)]
        assert len(made) == 1, done
        for refused in done:
            if refused is not made[0]:
                assert isinstance(refused, AdminError) and refused.status == 409, refused
                assert made[0].key.id in refused.message and refused.param == "key_id"
        async with db.session() as s:
            assert (await s.scalars(select(ApiKey.id).where(ApiKey.rotated_from == old.key.id))).all() == [
                made[0].key.id]


async def test_admin_keys(db: Database) -> None:
    svc = TenancyService(db)
    auth = SqlAuthenticator(db, ttl=1.0, admin_key="config-admin-secret")
    p = await auth.authenticate("config-admin-secret")
    assert p is not None and p.is_admin and p.tenant_id is None
    stored = await svc.create_key(None, admin=True, name="ops")
    p = await auth.authenticate(stored.secret)
    assert p is not None and p.is_admin and p.tenant_id is None
    assert await auth.authenticate("config-admin-secreT") is None


@pytest.mark.parametrize("token", ["", "sk-sy-", "sk-other-" + "a" * 40, "sk-sy-" + "a" * 43, "x" * 5000])
async def test_unknown_tokens(db: Database, token: str) -> None:
    assert await SqlAuthenticator(db).authenticate(token) is None


async def test_prefix_is_visible_for_identification(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant("prefixes")
    created = await svc.create_key(tenant.id)
    async with db.session() as s:
        prefixes = (await s.scalars(select(ApiKey.prefix).where(ApiKey.tenant_id == tenant.id))).all()
    assert prefixes == [created.secret[:12]]
