"""A gateway keeps serving on PostgreSQL while a newer version applies a migration flagged
``previous_code_compatible`` (a rolling upgrade). The migration changes the types of columns the
gateway reads (as 0012 and 0013 did), which invalidates the statements its connections had
prepared: every kind of request that touches those tables goes on answering (no 5xx) and every
usage row lands once, none journaled."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import openai
from sqlalchemy import func, select

from gateway.db import Database, migrate
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database
from tests.gateway.test_schema_compat import migrate_with
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread
from tests.support.usage_rows import usage_row

RETYPED = {"tenants": "name", "api_keys": "name", "usage_records": "model", "stored_responses": "model"}

NEWER = '''"""a newer version's compatible migration: wider text columns, one more nullable column each

Revision ID: 9998_wider
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "9998_wider"
down_revision = "{down}"
branch_labels = None
depends_on = None
previous_code_compatible = True


def upgrade() -> None:
    for table, column in {retyped!r}.items():
        op.alter_column(table, column, type_=sa.Text())
        op.add_column(table, sa.Column("note", sa.Text(), nullable=True))
'''


def newer_version(tmp_path: Path) -> Path:
    import shutil

    scripts = tmp_path / "newer_migrations"
    shutil.copytree(migrate.MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9998_wider.py").write_text(NEWER.format(down=migrate.head_revision(), retyped=RETYPED))
    return scripts


async def _every_kind(server_url: str, admin: httpx.AsyncClient, tag: str) -> tuple[list[str], list[int]]:
    """Admin calls, a new key's first authentication, a chat completion, a stored response and its
    retrieval, the usage report: the request ids metered, and every status seen."""
    statuses: list[int] = []  # the SDK's; the admin calls assert as they go

    async def call(method: str, path: str, **kw: object) -> httpx.Response:
        response = await admin.request(method, path, **kw)  # type: ignore[arg-type]
        assert response.status_code < 500, f"{method} {path} ({tag}): {response.status_code} {response.text}"
        return response

    tenant = (await call("POST", "/admin/v1/tenants", json={"name": f"t-{tag}-{uuid.uuid4().hex[:6]}"})).json()
    await call("GET", "/admin/v1/tenants")
    await call("GET", f"/admin/v1/tenants/{tenant['id']}")
    key = (await call("POST", "/admin/v1/keys", json={"tenant_id": tenant["id"], "name": tag})).json()
    await call("GET", f"/admin/v1/tenants/{tenant['id']}/keys")
    await call("GET", f"/admin/v1/keys/{key['id']}")
    client = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key=key["key"], max_retries=0)
    ids: list[str] = []
    for _ in range(2):
        chat = await client.chat.completions.with_raw_response.create(
            model="echo", messages=[{"role": "user", "content": f"hello {tag}"}])
        statuses.append(chat.status_code)
        ids.append(chat.headers["x-request-id"])
    stored = await client.responses.with_raw_response.create(model="echo", input=f"keep {tag}", store=True)
    statuses.append(stored.status_code)
    ids.append(stored.headers["x-request-id"])
    again = await client.responses.with_raw_response.retrieve(stored.parse().id)
    statuses.append(again.status_code)
    await call("GET", "/admin/v1/usage", params={"group_by": "model"})
    own = await client.get("/usage", cast_to=httpx.Response)
    statuses.append(own.status_code)
    return ids, statuses


async def test_a_running_gateway_serves_across_a_compatible_migration(
        fake_upstream_server: FakeUpstream, tmp_path: Path) -> None:
    from gateway.app import create_app

    fake_upstream_server.reset()
    name, url = await new_pg_database()
    db = Database.from_url(url)
    try:
        await asyncio.to_thread(migrate.upgrade, url)
        journal = tmp_path / "journal"
        settings = gateway_settings(fake_upstream_server.url, database={"url": url},
                                    usage={"journal_dir": str(journal)})
        with ServerThread(create_app(settings)) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                         headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
                before, seen = await _every_kind(server.url, admin, "before")
                for request_id in before:  # the usage writer's statements are prepared too
                    await usage_row(db, request_id)
                await asyncio.to_thread(migrate_with, newer_version(tmp_path), url, "9998_wider")
                after, seen_after = await _every_kind(server.url, admin, "after")
                after_too, seen_again = await _every_kind(server.url, admin, "again")
            assert [s for s in seen + seen_after + seen_again if s >= 500] == []
            for request_id in before + after + after_too:
                await usage_row(db, request_id)
        async with db.session() as s:
            counted = await s.scalar(select(func.count()).select_from(UsageRow))
        assert counted == len(before + after + after_too)
        assert not [p for p in journal.rglob("*") if p.is_file() and p.stat().st_size]
    finally:
        await db.dispose()
        await drop_pg_database(name)
