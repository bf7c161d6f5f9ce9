"""Token counts past 32 bits through the real gateway on PostgreSQL: an upstream's usage counts have
no bound, and a usage row holding one lands in ``usage_records`` and its rollups (PostgreSQL's
INTEGER refused it, and the row went to the quarantine file), and the report and the dashboard
show it. The openai SDK as the client, the fake upstream answering with the counts."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.dashboard.queries import Range, summary
from gateway.db import Database
from gateway.db.models import UsageHourly
from gateway.usage.report import ReportQuery, usage_report
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import migrated_pg_url  # noqa: F401  (fixture)
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread
from tests.support.usage_rows import usage_row

PROMPT, COMPLETION, CACHED = 3_000_000_000, 2_200_000_000, 2_500_000_000  # each past 2**31 - 1
USAGE = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": PROMPT + COMPLETION,
         "prompt_tokens_details": {"cached_tokens": CACHED}}


def _body(stream: bool) -> Any:
    answer = {"id": "x", "created": 0, "model": "m"}
    if not stream:
        return answer | {"object": "chat.completion", "usage": USAGE, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "big"}, "finish_reason": "stop"}]}
    chunk = answer | {"object": "chat.completion.chunk"}
    events = [chunk | {"choices": [{"index": 0, "delta": {"content": "big"}, "finish_reason": "stop"}]},
              chunk | {"choices": [], "usage": USAGE}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_a_usage_past_32_bits_lands_in_the_records_rollups_report_and_dashboard(
        migrated_pg_url: str, fake_upstream_server: FakeUpstream, tmp_path: Path, stream: bool) -> None:
    from gateway.app import create_app

    fake_upstream_server.reset()
    fake_upstream_server.fail_next(Fault(status=200, body=_body(stream),
                                         headers={"content-type": "text/event-stream"} if stream else {}))
    settings = gateway_settings(fake_upstream_server.url, database={"url": migrated_pg_url},
                                usage={"journal_dir": str(tmp_path / "journal")},
                                prices={"echo": {"input_per_million": 0.01, "output_per_million": 0.02}})
    db = Database.from_url(migrated_pg_url)
    try:
        with ServerThread(create_app(settings)) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                         headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
                tenant = (await admin.post("/admin/v1/tenants", json={"name": f"big-{uuid.uuid4().hex[:8]}"})).json()
                key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"]})).json()["key"]
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
            raw = await client.chat.completions.with_raw_response.create(
                model="echo", stream=stream, messages=[{"role": "user", "content": "count big"}])
            if stream:
                chunks = raw.parse()
                assert isinstance(chunks, openai.AsyncStream)
                async for _ in chunks:
                    pass
            row = await usage_row(db, raw.headers["x-request-id"])
        assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens, row.exact) == (
            PROMPT, COMPLETION, CACHED, True)
        assert not list((tmp_path / "journal").glob("*quarantine*"))
        async with db.session() as s:
            hourly = (await s.execute(select(UsageHourly.prompt_tokens, UsageHourly.completion_tokens,
                                             UsageHourly.cached_tokens)
                                      .where(UsageHourly.tenant_id == tenant["id"]))).one()
        assert tuple(hourly) == (PROMPT, COMPLETION, CACHED)
        [report] = await usage_report(db, ReportQuery(tenant_id=tenant["id"], group_by=()))
        assert (report["prompt_tokens"], report["completion_tokens"], report["cached_tokens"]) == (
            PROMPT, COMPLETION, CACHED)
        assert report["total_tokens"] == PROMPT + COMPLETION and report["cost"] > 0
        now = datetime.now(UTC)
        for bucket, back in (("minute", timedelta(hours=1)), ("hour", timedelta(days=1))):  # records, rollups
            rng = Range.parse((now - back).isoformat(), (now + timedelta(hours=1)).isoformat(), bucket)
            totals = (await summary(db, tenant["id"], rng))["totals"]
            assert (totals["prompt_tokens"], totals["completion_tokens"]) == (PROMPT, COMPLETION), bucket
    finally:
        await db.dispose()
