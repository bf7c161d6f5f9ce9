"""The request log's "Older requests" in headless Chromium: it pages on with the filters of the search
that produced the rows shown, never with a search box or status edited since without pressing Search
(which would mix the old search's cursor with a new search)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY
from tests.gateway.dashboard_fixtures import DashEnv, dash  # noqa: F401
from tests.gateway.test_dashboard_browser import CHROMIUM, browser, sign_in  # noqa: F401

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

PER_MODEL = 60  # more than one page (50) of each model
BERRY_ERRORS = 10  # the oldest berry requests failed: older than apple's first page


@pytest.fixture(scope="module")
async def fruit_key(dash: DashEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tenant whose requests alternate between models apple (all answered) and berry, a minute apart."""
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": f"fruit-{uuid.uuid4().hex[:6]}"})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": "fruit"})).json()
    db = Database.from_url(dash.db_url)
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path_factory.mktemp("fruit"))
    now = time.time()
    for i in range(2 * PER_MODEL):
        model = ("apple", "berry")[i % 2]
        failed = model == "berry" and i // 2 >= PER_MODEL - BERRY_ERRORS
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key["id"], tenant_id=tenant["id"], model=model, deployment="d",
            provider="openai", endpoint="chat.completions", started_at=now - 60 * i - 60,
            status=502 if failed else 200, error_type="upstream_error" if failed else None,
            prompt_tokens=0 if failed else 10, completion_tokens=0 if failed else 5, cost=0.0, latency_ms=100.0,
        ))  # fmt: skip
    assert await writer.flush()
    writer.journal.close()
    await db.dispose()
    return str(key["key"])


async def test_older_requests_keeps_the_search_that_made_the_page(browser, dash: DashEnv, fruit_key: str) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await sign_in(page, dash.url, fruit_key)
    await page.click("#tab-requests")
    rows = page.locator("#requests tbody tr")
    models = rows.locator("td:nth-child(3)")
    await expect(rows).to_have_count(50)
    await page.fill("#q", "apple")
    await page.click("#search")
    await expect(models).to_have_text(["apple"] * 50)
    await expect(page.locator("#more")).to_be_visible()
    # edit both filters, do not press Search, page on: the rest of apple's requests, nothing of berry
    await page.fill("#q", "berry")
    await page.select_option("#status", "error")
    await page.click("#more")
    await expect(models).to_have_text(["apple"] * PER_MODEL)
    await expect(page.locator("#more")).to_be_hidden()
    assert set(await rows.locator("td:nth-child(5)").all_inner_texts()) == {"200"}
    times = await rows.locator("td:first-child").evaluate_all("cells => cells.map(c => Date.parse(c.dataset.value))")
    assert times == sorted(times, reverse=True)
    # the CSV link exports the search shown, not the edited boxes
    query = parse_qs(urlsplit(await page.get_attribute("#csv-requests", "href") or "").query)
    assert query["q"] == ["apple"] and "status" not in query
    # pressing Search starts the edited search from its first page
    await page.click("#search")
    await expect(models).to_have_text(["berry"] * BERRY_ERRORS)
    await expect(page.locator("#more")).to_be_hidden()
    await context.close()
