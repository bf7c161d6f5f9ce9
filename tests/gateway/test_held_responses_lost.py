"""A background response that can never be asked about again ends too: one whose upstream forgot it
(a 404) or whose deployment a reload removed is metered at once with what is known (the prompt its
creating request estimated, marked ``lost``); one whose asking keeps failing is asked again only
after a backoff, so such rows leave the follower's passes to live ones, and is metered
(``expired``) once older than ``GIVE_UP_AFTER``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select, update

from gateway.app import create_app
from gateway.db import Database
from gateway.db.models import StoredResponse, UsageRow
from gateway.held_responses import GIVE_UP_AFTER
from gateway.settings import load_settings
from tests.conftest import ADMIN_KEY
from tests.gateway.tenancy_fixtures import REDIS_URL, db, plain_url  # noqa: F401
from tests.gateway.test_responses_background_usage import PRICE, _metered, _served
from tests.gateway.test_responses_store import Gateway
from tests.gateway.test_tenant_e2e import wait_for_rows
from tests.support.fake_responses import FakeResponsesUpstream
from tests.support.servers import ServerThread

DEAD = 20  # background responses whose upstream fails every question


@pytest.fixture
def native() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream()
    server.id_prefix = f"resp_up_{uuid.uuid4().hex[:8]}_"  # ids no earlier test stored
    yield server.start()
    server.stop()


def _assert_lost(row: UsageRow, outcome: str) -> None:
    """Metered with the prompt estimate alone, marked ``outcome``."""
    assert row.prompt_tokens > 0 and row.completion_tokens == 0 and not row.exact
    assert row.error_type == outcome and row.cost == pytest.approx(row.prompt_tokens * PRICE / 1e6)


def test_a_response_its_upstream_forgot_is_metered_once_as_lost(
        db: Database, native: FakeResponsesUpstream, tmp_path: Path) -> None:
    with _served(db, native, str(tmp_path), 0.2) as gateway:
        tenant, client = gateway.tenant()
        queued = client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
        del native.held[queued.id]  # the upstream forgot it: a 404 for its id
        started, ended = _metered(db, tenant)
    assert (started.prompt_tokens, started.completion_tokens) == (0, 0)
    _assert_lost(ended, "lost")


def _config(native: FakeResponsesUpstream, db: Database, journal: Path, gone: bool) -> dict[str, Any]:
    deployment = {"provider": "openai", "model": "up-model", "api_base": native.url, "api_key": "sk-up",
                  "responses_api": True}
    models = [{"name": "native", "deployments": [deployment]}]
    if not gone:
        models.append({"name": "other", "deployments": [deployment | {"name": "other-dep"}]})
    return {"auth": {"admin_key": ADMIN_KEY}, "database": {"url": plain_url(db)}, "redis": {"url": REDIS_URL},
            "usage": {"journal_dir": str(journal), "background_poll_seconds": 0.2}, "models": models,
            "prices": {name: {"input_per_million": PRICE, "output_per_million": PRICE} for name in ("native", "other")}}


def test_a_response_whose_deployment_a_reload_removed_is_metered_once_as_lost(
        db: Database, native: FakeResponsesUpstream, tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(native, db, tmp_path / "journal", gone=False)))
    with (
        ServerThread(create_app(load_settings(path, env={}), config_path=path)) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
    ):
        tenant, client = Gateway(server.url, admin).tenant()
        queued = client.responses.create(model="other", input="work", background=True, max_output_tokens=2)
        path.write_text(yaml.safe_dump(_config(native, db, tmp_path / "journal", gone=True)))
        admin.post("/admin/v1/reload").raise_for_status()
        started, ended = _metered(db, tenant)
        # the follower (every 0.2 s) may have asked the upstream before the reload: it said queued
        assert queued.status == "queued"
    _assert_lost(ended, "lost")


async def _age(db: Database, response_ids: list[str], seconds: float) -> None:
    """Started ``seconds`` earlier than they were, as their rows say."""
    other = Database.from_url(plain_url(db))
    try:
        async with other.session() as s:
            for response_id, pending in (await s.execute(select(StoredResponse.id, StoredResponse.unsettled).where(
                    StoredResponse.id.in_(response_ids)))).all():
                pending = dict(pending) | {"started_at": pending["started_at"] - seconds}
                await s.execute(update(StoredResponse).where(StoredResponse.id == response_id).values(
                    unsettled=pending))
            await s.commit()
    finally:
        await other.dispose()


def _wait(condition: Any) -> None:
    deadline = time.monotonic() + 15
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_failing_responses_back_off_leave_passes_to_live_ones_and_expire(
        db: Database, native: FakeResponsesUpstream, tmp_path: Path) -> None:
    dead = FakeResponsesUpstream()
    dead.id_prefix = f"resp_a_{uuid.uuid4().hex[:8]}_"  # before the live one's in id order
    with _served(db, native, str(tmp_path), 0.2, others={"dead": dead.start().url}) as gateway:
        tenant, client = gateway.tenant()
        dead.reach_failure = 503  # every question about one it holds fails
        ids = [client.responses.create(model="dead", input="work", background=True, max_output_tokens=2).id
               for _ in range(DEAD)]
        _wait(lambda: len(dead.reached) >= DEAD)  # each asked once, and failed
        asked = len(dead.reached)
        live = client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
        native.finish(live.id)
        rows = wait_for_rows(db, tenant, DEAD + 2)
        assert [r.error_type for r in rows].count(None) == DEAD + 2
        assert len(dead.reached) == asked  # every failing one waits out its backoff: not asked again meanwhile
        asyncio.run(_age(db, ids, GIVE_UP_AFTER))
        rows = _metered(db, tenant, 2 * DEAD + 2)
    expired = [r for r in rows if r.error_type == "expired"]
    assert len(expired) == DEAD and len(dead.reached) == asked
    for row in expired:
        _assert_lost(row, "expired")
    dead.stop()
