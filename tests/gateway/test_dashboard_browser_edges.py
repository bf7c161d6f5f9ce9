"""The dashboards at their edges, in headless Chromium: a tenant whose names, models and errors are
markup, costs from a millionth of a dollar to millions, a new tenant with no usage in a fresh
browser (no console error anywhere), a session ended elsewhere, a range the API refuses, the
default custom dates in a week that changed the clocks, a time zone the server does not know, and
a request-log search that fails, and a proxy's HTML error page or a lost connection instead of the API."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
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

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

MARKUP = '<img src=x onerror="window.__xss=1">"</script><script>window.__xss=2</script>'
SHORT = "<img src=x onerror=__xss=3></script>"  # fits error_type and service_tier
UNKNOWN_TZ = """(() => {  // the browser reports a zone the server's zoneinfo lacks
  const resolved = Intl.DateTimeFormat.prototype.resolvedOptions;
  Intl.DateTimeFormat.prototype.resolvedOptions = function () {
    return { ...resolved.call(this), timeZone: "Etc/Unknown" };
  };
})();"""
COSTS = {"big": 1234567.5, "noisy": 0.1 + 0.2, "tiny": 2e-7}  # model -> the cost of its one request


@dataclass
class Odd:
    name: str
    key: str


@pytest.fixture(scope="module")
async def odd(dash: DashEnv, tmp_path_factory: pytest.TempPathFactory) -> Odd:
    """A tenant named in markup, with a key named so and requests of markup and odd costs."""
    name = f"{uuid.uuid4().hex[:4]}{MARKUP}"
    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": name})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": MARKUP})).json()
        await admin.put(f"/admin/v1/tenants/{tenant['id']}/limits", json={"cost_budget": 2e6})
    db = Database.from_url(dash.db_url)
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path_factory.mktemp("odd"))
    now = time.time()
    for i, (model, cost) in enumerate([*COSTS.items(), (MARKUP, 0.0)]):
        failed = model == MARKUP
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key["id"], tenant_id=tenant["id"], model=model, deployment=MARKUP,
            provider="openai", endpoint="chat.completions", started_at=now - 60 * i - 60, status=502 if failed else 200,
            error_type=SHORT if failed else None, prompt_tokens=0 if failed else 2_000_000_000, completion_tokens=1,
            cost=cost, latency_ms=100.0, service_tier=SHORT,
        ))  # fmt: skip
    assert await writer.flush()
    writer.journal.close()
    await db.dispose()
    return Odd(name, key["key"])


def watch(page, problems: list[str]) -> None:  # type: ignore[no-untyped-def]
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text} {m.location}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: problems.append(f"dialog: {d.message}"))


async def test_markup_in_names_models_and_errors_stays_text(browser, dash: DashEnv, odd: Odd) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    problems: list[str] = []
    watch(page, problems)
    await sign_in(page, dash.url, odd.key)
    assert await page.inner_text("#who") == odd.name
    await page.select_option("#split", "key")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")
    assert MARKUP in await page.locator("#chart-requests .u-legend").inner_text()  # the key's name
    assert MARKUP in await page.locator("#by-model").inner_text() and SHORT in await page.inner_text("#errors")
    await page.click("#tab-requests")
    await page.locator("#requests tbody tr", has_text=SHORT).click()
    await expect(page.locator("#detail")).to_be_visible()
    assert await page.inner_text("#detail-fields dd[data-field='model']") == MARKUP
    assert SHORT in await page.inner_text("#detail-why")
    assert await page.title() == "Switchyard — usage"
    assert await page.evaluate("window.__xss") is None and await page.locator("main img, header img").count() == 0
    assert problems == []
    await context.close()


async def test_costs_read_as_dollars_and_large_numbers_in_full(browser, dash: DashEnv, odd: Odd) -> None:  # type: ignore[no-untyped-def]
    """Costs show two to eight decimals with grouping (1,234,567.50; 0.30; 0.0000002), never 0 for a
    cost that is not, never an exponent or floating noise; token counts in full."""
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await sign_in(page, dash.url, odd.key)
    shown = {"big": "1,234,567.50", "noisy": "0.30", "tiny": "0.0000002"}
    rows = page.locator("#by-model tbody tr")
    for model, text in shown.items():
        assert (await rows.filter(has_text=model).locator("td").nth(7).inner_text()) == text
    assert re.fullmatch(r"1,234,567\.\d{2,8}", await page.inner_text("#total-cost b"))
    assert await page.inner_text("#total-prompt_tokens b") == "6,000,000,000"
    used, limit = (await page.locator("#live tbody tr").last.locator("td").all_inner_texts())[1:]
    assert re.fullmatch(r"1,234,567\.\d{2,8}", used) and limit == "2,000,000.00"
    numbers = await page.locator("#totals b, #view-usage td").evaluate_all(
        "cells => cells.filter(c => c.dataset.value !== '' && !isNaN(Number(c.dataset.value))).map(c => c.textContent)")
    assert numbers and all(re.fullmatch(r"[\d,]+(\.\d{1,8})?%?", n) and not re.search(r"0{10}\d*%?$", n.split(".")[-1])
                           for n in numbers), numbers  # a share of requests as a percentage
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(4)
    costs = await page.locator("#requests tbody tr td:nth-child(7)").all_inner_texts()
    assert sorted(costs) == sorted([*shown.values(), "0.00"])
    await page.locator("#requests tbody tr", has_text="tiny").click()
    await expect(page.locator("#detail-fields dd[data-field='cost']")).to_have_text("0.0000002")
    await context.close()


async def test_a_new_tenant_in_a_fresh_browser_logs_no_console_error(dash: DashEnv) -> None:
    """Sign-in, every view, split and range of a tenant without usage, and the operator's view: not
    one console error or warning (a fresh browser asks for /favicon.ico unless the page names one)."""
    from playwright.async_api import async_playwright, expect

    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tenant = (await admin.post("/admin/v1/tenants", json={"name": f"new-{uuid.uuid4().hex[:6]}"})).json()
        key = (await admin.post("/admin/v1/keys", json={"tenant_id": tenant["id"]})).json()["key"]
    async with async_playwright() as p:
        fresh = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        for who, view in ((key, "requests"), (ADMIN_KEY, "operator")):
            context = await fresh.new_context(timezone_id="Australia/Lord_Howe")  # a half-hour DST shift
            page = await context.new_page()
            problems: list[str] = []
            watch(page, problems)
            await sign_in(page, dash.url, who)
            for split in ("model", "key"):
                await page.select_option("#split", split)
                await expect(page.locator("body")).to_have_attribute("data-ready", "1")
            for rng in ("1h", "24h", "30d"):
                await page.select_option("#range", rng)
                await expect(page.locator("body")).to_have_attribute("data-ready", "1")
            await page.click(f"#tab-{view}")
            await expect(page.locator(f"#view-{view}")).to_be_visible()
            await expect(page.locator("body")).to_have_attribute("data-ready", "1")
            assert await page.inner_text("#message") == ""
            await page.wait_for_timeout(300)
            assert problems == [], problems
            await context.close()
        await fresh.close()


async def test_a_session_ended_elsewhere_leads_every_view_back_to_sign_in(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(50)
    csrf = (await (await context.request.get(dash.url + "/dashboard/api/me")).json())["csrf"]
    await context.request.post(dash.url + "/dashboard/logout", form={"csrf": csrf})  # as another tab does
    await page.wait_for_url("**/dashboard/login*", timeout=12_000)
    assert await page.locator("#requests").count() == 0
    await context.close()


async def test_a_refused_range_shows_its_error_and_no_numbers_of_the_last(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    assert await page.locator("#total-requests b").is_visible()
    await page.select_option("#range", "custom")
    await page.fill("#start", "2026-02-10")
    await page.fill("#end", "2026-02-01")
    await page.click("#apply")
    await page.wait_for_selector("body[data-error]")
    assert "start must be before end" in await page.inner_text("#message")
    assert await page.locator("#view-usage").is_hidden() and await page.locator("#csv").is_hidden()
    await page.fill("#start", "2026-01-01")
    await page.click("#apply")
    await page.wait_for_selector("body[data-ready='1']")
    assert await page.locator("#total-requests b").is_visible() and await page.locator("#csv").is_visible()
    await context.close()


async def test_the_default_custom_dates_span_seven_local_days_after_a_clock_change(  # type: ignore[no-untyped-def]
        browser, dash: DashEnv) -> None:
    """Shortly after midnight a week after New York's spring change (a 23-hour day), "From" is six
    calendar days before today, not seven (six times 24 hours back lands on the evening before)."""
    context = await browser.new_context(timezone_id="America/New_York")
    await context.clock.set_fixed_time(datetime(2025, 3, 15, 4, 30, tzinfo=UTC))  # 00:30 on the 15th in New York
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    assert (await page.input_value("#start"), await page.input_value("#end")) == ("2025-03-09", "2025-03-15")
    await context.close()


async def test_a_time_zone_the_server_does_not_know_falls_back_to_utc(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    """The data calls ask again in UTC, and the page says so next to the range, instead of showing no data."""
    from playwright.async_api import expect

    context = await browser.new_context()
    await context.add_init_script(UNKNOWN_TZ)
    page = await context.new_page()
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "tz=" in r.url else None)
    await sign_in(page, dash.url, dash.a.key)
    assert int(await page.get_attribute("#total-requests b", "data-value") or 0) == dash.a.requests
    note = page.locator("#tz-note")
    assert await note.is_visible() and "UTC" in await note.inner_text() and "Etc/Unknown" in await note.inner_text()
    assert await page.inner_text("#tz") == "UTC" and await page.inner_text("#message") == ""
    assert "tz=UTC" in (await page.get_attribute("#csv", "href") or "")
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(50)
    assert "tz=UTC" in asked[-1] and "tz=Etc" in asked[0]
    await context.close()


async def test_a_failed_log_search_leaves_no_rows_of_the_last(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    """A search the API refuses (a bad filter) or that never arrives (the network) shows its error
    alone: none of the rows, the detail or the "older" button of the search before it."""
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#tab-requests")
    rows = page.locator("#requests tbody tr")
    await expect(rows).to_have_count(50)
    await rows.first.click()
    await expect(page.locator("#detail")).to_be_visible()
    await page.evaluate("() => document.getElementById('status').add(new Option('bogus', 'bogus'))")
    await page.select_option("#status", "bogus")
    await page.click("#search")
    await expect(page.locator("#message")).to_contain_text("status must be one of")
    await expect(rows).to_have_count(0)
    assert await page.locator("#detail").is_hidden() and await page.locator("#more").is_hidden()
    await page.select_option("#status", "")
    await page.click("#search")
    await expect(rows).to_have_count(50)
    await expect(page.locator("#message")).to_have_text("")
    await page.route("**/dashboard/api/requests?*", lambda route: route.abort())
    await page.click("#search")
    await expect(page.locator("#message")).to_have_text(re.compile(r"\S"))
    await expect(rows).to_have_count(0)
    await context.close()


async def test_a_proxy_error_page_is_said_as_its_status_not_a_parse_error(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    """A load balancer's HTML 502 in front of the gateway reads as the status it is, and a lost
    connection as the gateway out of reach, never as the JSON parser's "Unexpected token"."""
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(50)
    await page.route("**/dashboard/api/requests?*", lambda route: route.fulfill(
        status=502, content_type="text/html", body="<html><body><h1>502 Bad Gateway</h1></body></html>"))
    await page.click("#search")
    await expect(page.locator("#message")).to_contain_text("502")
    assert "token" not in await page.inner_text("#message") and "JSON" not in await page.inner_text("#message")
    await page.unroute("**/dashboard/api/requests?*")
    await page.route("**/dashboard/api/requests?*", lambda route: route.abort())
    await page.click("#search")
    await expect(page.locator("#message")).to_contain_text("could not be reached")
    await context.close()
