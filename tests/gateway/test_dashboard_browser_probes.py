"""The dashboards as a tenant and an operator use them, in headless Chromium: sign-in with keys that
no longer work, sign-out and the back button, keyboard use, labels and headers, the request log
opened first, totals that match the admin API's usage report for the same UTC days, very long
names, ranges without data or across a month, a tenant editing the page's address, and costs
under a hundred-millionth of a dollar."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY
from tests.gateway.dashboard_fixtures import DashEnv, dash  # noqa: F401
from tests.gateway.test_dashboard_browser import CHROMIUM, FLAGS, browser, sign_in  # noqa: F401
from tests.gateway.test_dashboard_browser_edges import watch

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
INVALID = "That API key is not valid (or is revoked or expired)."


async def _new_key(dash: DashEnv, *, revoke: bool = False, disable: bool = False) -> str:
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": f"probe-{datetime.now().timestamp()}"})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": "k"})).json()
        if revoke:
            assert (await admin.post(f"/admin/v1/keys/{key['id']}/revoke")).status_code == 200
        if disable:
            assert (await admin.post(f"/admin/v1/tenants/{tenant['id']}/disable")).status_code == 200
    return str(key["key"])


@pytest.mark.parametrize("kind", ["wrong", "revoked", "disabled"])
async def test_a_key_that_does_not_work_gets_a_clear_message(browser, dash: DashEnv, kind: str) -> None:  # type: ignore[no-untyped-def]
    key = "sk-wrong-key" if kind == "wrong" else await _new_key(dash, revoke=kind == "revoked",
                                                                    disable=kind == "disabled")
    context = await browser.new_context()
    page = await context.new_page()
    problems: list[str] = []
    watch(page, problems)
    await page.goto(dash.url + "/dashboard/login")
    await page.fill("#api-key", key)
    async with page.expect_response(lambda r: r.url.endswith("/dashboard/login")) as answer:
        await page.click("#sign-in")
    assert (await answer.value).status == 401
    assert await page.inner_text("#message") == INVALID
    assert await page.get_attribute("#message", "role") == "alert"  # read out by a screen reader
    assert key not in await page.content()
    assert not [c for c in await context.cookies() if c["name"] == "sy_session"]
    assert [p for p in problems if "401" not in p] == []
    await context.close()


async def test_after_sign_out_the_back_button_shows_no_usage(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#logout")
    await page.wait_for_url("**/dashboard/login")
    await page.go_back()
    await page.wait_for_timeout(500)
    assert page.url.endswith("/dashboard/login") or await page.locator("#totals .card").count() == 0
    assert dash.a.name not in await page.content()
    await context.close()


async def test_the_keyboard_opens_a_request_and_sorts_a_table(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    header = page.locator("#by-model thead th").first
    await header.focus()
    assert await header.evaluate("el => el === document.activeElement")
    await page.keyboard.press("Enter")
    assert await header.get_attribute("aria-sort") == "ascending"
    await page.click("#tab-requests")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")
    await page.locator("#requests tbody tr").first.focus()
    await page.keyboard.press("Enter")
    await expect(page.locator("#detail")).to_be_visible()
    await context.close()


async def test_every_control_has_a_label_and_every_column_a_header(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    unlabelled = await page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select')]
        .filter(el => !el.labels || el.labels.length === 0).map(el => el.id)""")
    assert unlabelled == []
    empty = await page.evaluate("""() => [...document.querySelectorAll('#view-usage th')]
        .filter(th => !th.textContent.trim()).map(th => th.closest('table').id)""")
    assert empty == []
    await context.close()


async def test_the_request_log_opened_first_names_the_keys(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(dash.url + "/dashboard/login")
    await page.fill("#api-key", dash.a.key)
    await page.click("#sign-in")
    await page.wait_for_selector("body[data-ready='1']")
    await page.goto(dash.url + "/dashboard#requests")
    await page.reload()
    await page.wait_for_selector("body[data-ready='1'] #requests tbody tr")
    keys = set(await page.locator("#requests tbody tr td:nth-child(2)").all_inner_texts())
    assert keys and keys <= {"alpha0", "alpha1"}
    await context.close()


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "America/Los_Angeles"])
async def test_custom_days_total_the_admin_usage_report(browser, dash: DashEnv, zone: str) -> None:  # type: ignore[no-untyped-def]
    """Custom dates in UTC (the page's own tz) total what /admin/v1/usage reports for those days,
    across a month boundary, in whatever zone the browser is."""
    end = datetime.now(UTC).date()
    start = end - timedelta(days=3)
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        report = (await admin.get("/admin/v1/usage", params={"start": start.isoformat(), "end": end.isoformat(),
                                                                "tenant_id": dash.a.id, "group_by": "tenant"})).json()
    expected = sum(r["requests"] for r in report["data"])
    context = await browser.new_context(timezone_id=zone)
    page = await context.new_page()
    problems: list[str] = []
    watch(page, problems)
    await sign_in(page, dash.url, dash.a.key)
    shown = await page.locator("#tz").inner_text()
    assert shown == zone
    cookies = {c["name"]: c["value"] for c in await context.cookies()}
    async with httpx.AsyncClient(base_url=dash.url, cookies=cookies) as c:
        data = (await c.get("/dashboard/api/summary", params={"start": start.isoformat(), "end": end.isoformat(),
                                                                "tz": "UTC"})).json()
    assert data["totals"]["requests"] == expected
    assert sum(r["requests"] for r in data["series"]) == expected
    assert problems == []
    await context.close()


@pytest.mark.parametrize("width", [1280, 390])
async def test_a_very_long_tenant_name_does_not_widen_the_page(browser, dash: DashEnv, width: int) -> None:  # type: ignore[no-untyped-def]
    name = "W" * 190 + datetime.now().strftime("%H%M%S%f")[:10]
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": name})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": "K" * 200})).json()
    context = await browser.new_context(viewport={"width": width, "height": 800})
    page = await context.new_page()
    for who in (key["key"], ADMIN_KEY):
        await sign_in(page, dash.url, who)
        if who == ADMIN_KEY:
            await page.select_option("#tenant", tenant["id"])
            await page.wait_for_selector("body[data-ready='1']")
        assert name in await page.inner_text("#who")
        wide = await page.evaluate("""() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.id || e.tagName)""")
        assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), wide
        await page.click("#logout")
        await page.wait_for_url("**/dashboard/login")
    await context.close()


async def test_a_range_without_data_and_one_across_a_month_show_every_day(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context(timezone_id="Asia/Kolkata")
    page = await context.new_page()
    problems: list[str] = []
    watch(page, problems)
    await sign_in(page, dash.url, dash.a.key)
    await page.select_option("#range", "custom")
    for start, end, days in (("2021-01-30", "2021-02-02", 4), ("2020-02-27", "2020-03-01", 4)):
        await page.fill("#start", start)
        await page.fill("#end", end)
        await page.click("#apply")
        await page.wait_for_selector("body[data-ready='1']")
        await page.wait_for_function(f"document.querySelectorAll('#series tbody tr').length === {days}")
        first = await page.locator("#series tbody tr td").first.inner_text()
        assert first.startswith(datetime.fromisoformat(start).strftime("%b %-d, %Y")), first
        assert await page.inner_text("#total-requests b") == "0"
        assert await page.inner_text("#total-cost b") == "0.00"
    assert problems == []
    await context.close()


async def test_a_tenant_editing_the_address_sees_only_its_own(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context()
    page = await context.new_page()
    problems: list[str] = []
    watch(page, problems)
    await sign_in(page, dash.url, dash.a.key)
    for address in (f"#usage?tenant={dash.b.id}&range=30d", f"#requests?tenant={dash.b.id}", "#operator"):
        await page.goto(dash.url + "/dashboard" + address)
        await page.reload()
        await page.wait_for_selector("body[data-ready='1']")
        assert dash.b.name not in await page.content() and await page.inner_text("#who") == dash.a.name
        assert await page.locator("#view-operator").is_hidden()
    assert problems == []
    await context.close()


async def test_costs_under_a_hundred_millionth_show_their_digits(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A request of a very cheap model (a few tokens at a thousandth of a dollar per million) costs
    under $0.00000001: the page showed "0.00" (eight decimals at most), or 0.000000015 as 0.00000002."""
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": f"cheap-{uuid.uuid4().hex[:6]}"})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": "k"})).json()
    db = Database.from_url(dash.db_url)
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path)
    costs = {"nano": 4e-9, "micro": 1.5e-8}
    for i, (model, cost) in enumerate(costs.items()):
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key["id"], tenant_id=tenant["id"], model=model, deployment="d",
            provider="openai", endpoint="chat.completions", started_at=time.time() - 60 * (i + 1), status=200,
            prompt_tokens=3, completion_tokens=1, cost=cost, latency_ms=10.0))  # fmt: skip
    assert await writer.flush()
    writer.journal.close()
    await db.dispose()
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, key["key"])
    shown = {"nano": "0.000000004", "micro": "0.000000015"}
    rows = page.locator("#by-model tbody tr")
    assert {m: await rows.filter(has_text=m).locator("td").nth(7).inner_text() for m in costs} == shown
    assert await page.inner_text("#total-cost b") == "0.000000019"
    await page.click("#tab-requests")
    await page.wait_for_selector("body[data-ready='1'] #requests tbody tr")
    assert sorted(await page.locator("#requests tbody tr td:nth-child(7)").all_inner_texts()) == sorted(shown.values())
    await context.close()
