"""The dashboards in headless Chromium (Debian's, driven by Playwright; no browser download):
tenant A signs in, sees its tenant's name and seeded totals in cards, charts and tables, nothing of
tenant B on the page or in any JSON the page fetched, and every endpoint the pages called refuses to
answer for B; the charts' screenshots show an axis fitted to the range and the quiet buckets drawn
at zero; the request log searches and opens a request; CSV export matches; the operator's view is
for admins only; phone width has no sideways scrolling. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.dashboard_fixtures import DashEnv, dash  # noqa: F401
from tests.support.png import Image, read_png

CHROMIUM = os.environ.get("SWITCHYARD_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} "
                                "(tests/start_services.sh installs Debian's chromium)")


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        await b.close()


async def sign_in(page, url: str, key: str) -> None:  # type: ignore[no-untyped-def]
    await page.goto(url + "/dashboard")
    assert page.url.endswith("/dashboard/login")
    await page.fill("#api-key", key)
    await page.click("#sign-in")
    await page.wait_for_selector("body[data-ready='1']", timeout=20_000)


async def card(page, key: str) -> str:  # type: ignore[no-untyped-def]
    return await page.get_attribute(f"#total-{key} b", "data-value")



def stroke(img: Image, rgb: tuple[int, int, int], tol: int = 70) -> list[tuple[int, int]]:
    return [(x, y) for y in range(img.height) for x in range(img.width)
            if sum(abs(a - b) for a, b in zip(img.pixel(x, y), rgb, strict=True)) <= tol]


async def check_chart(page, chart_id: str, path: Path, expect_zeros: bool) -> dict:  # type: ignore[no-untyped-def]
    """The chart's screenshot: its line runs from the first bucket to the last across an axis that
    is exactly the chosen range, and touches the bottom of the plot at every bucket without traffic.
    The last series is checked: it is drawn on top of the others."""
    png = await page.locator(f"#{chart_id} .u-over").screenshot(path=str(path))
    img = read_png(png)
    info = await page.evaluate("""id => { const u = window.__sy.charts[id]; const n = u.series.length - 1;
        return {min: u.scales.x.min, max: u.scales.x.max, xs: Array.from(u.data[0]), ys: Array.from(u.data[n]),
                colour: u.series[n]._stroke || u.series[n].stroke}; }""", chart_id)
    colour = info["colour"] if isinstance(info["colour"], str) else "#2563eb"
    points = stroke(img, tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5)))  # type: ignore[arg-type]
    assert points, "no line drawn"
    span = info["max"] - info["min"]

    def x_of(t: float) -> float:
        return (t - info["min"]) / span * (img.width - 1)

    columns = [x for x, _ in points]
    assert min(columns) <= x_of(info["xs"][0]) + 3 and x_of(info["xs"][0]) <= 0.05 * img.width  # from the left edge
    assert max(columns) >= x_of(info["xs"][-1]) - 3  # ... to the last bucket
    zeros = [t for t, y in zip(info["xs"], info["ys"], strict=True) if y == 0]
    assert bool(zeros) == expect_zeros
    bottom = [x for x, y in points if y >= img.height - 4]
    for t in zeros:
        assert any(abs(x - x_of(t)) <= 3 for x in bottom), f"no zero drawn at {datetime.fromtimestamp(t)}"
    return info


async def test_tenant_sees_its_usage_on_a_fitted_axis_with_zero_buckets(browser, dash: DashEnv,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="America/New_York")
    page = await context.new_page()
    responses: list[object] = []
    page.on("response", lambda r: responses.append(r) if "/dashboard/api/" in r.url else None)
    await sign_in(page, dash.url, dash.a.key)
    await page.screenshot(path=str(tmp_path / "tenant-a.png"), full_page=True)
    assert await page.inner_text("#who") == dash.a.name and dash.a.id not in await page.inner_text("header")
    assert await page.inner_text("#tz") == "America/New_York"
    assert int(await card(page, "requests")) == dash.a.requests
    assert int(await card(page, "errors")) == dash.a.errors
    assert int(await card(page, "total_tokens")) == dash.a.prompt_tokens + dash.a.completion_tokens
    assert float(await card(page, "cost")) == pytest.approx(dash.a.cost)
    for chart_id in ("chart-requests", "chart-tokens", "chart-cost", "chart-errors"):
        assert await page.locator(f"#{chart_id} canvas").count() == 1
    summary = await (await context.request.get(dash.url + "/dashboard/api/summary?range=7d&tz=America/New_York")).json()
    info = await check_chart(page, "chart-requests", tmp_path / "7d.png", expect_zeros=True)
    assert info["min"] == datetime.fromisoformat(summary["start"]).timestamp()
    assert await page.evaluate("window.__sy.charts['chart-requests'].data[0].every(t => "  # New York midnights
                               "new Date(t * 1000).toLocaleTimeString('en-GB', {timeZone: 'America/New_York'}) "
                               "=== '00:00:00')")
    keys = await page.locator("#by-key tbody tr td:first-child").all_inner_texts()
    assert sorted(keys) == sorted(dash.a.key_ids)
    latency = await page.locator("#latency tbody tr:first-child td").all_inner_texts()
    assert len(set(latency[1:])) > 1  # p50, p90 and p99 differ

    # the last 30 days: one line over the whole month, flat at zero before the seeded days
    await page.select_option("#range", "30d")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")
    info = await check_chart(page, "chart-requests", tmp_path / "30d.png", expect_zeros=True)
    assert info["max"] - info["min"] >= 30 * 86400 and len(info["xs"]) in (30, 31)
    # the last 24 hours, by hour: every hour has traffic; the axis is that day, not years
    await page.select_option("#range", "24h")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")
    info = await check_chart(page, "chart-requests", tmp_path / "24h.png", expect_zeros=False)
    assert 24 * 3600 <= info["max"] - info["min"] <= 25 * 3600 and len(info["xs"]) == 25
    await page.select_option("#split", "model")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")
    for chart_id in ("chart-requests", "chart-tokens", "chart-cost", "chart-errors"):  # x, echo, other
        assert await page.evaluate(f"window.__sy.charts['{chart_id}'].series.length") == 3
    assert await page.inner_text("#cap-errors") == "Errors (429s included) by model"
    await page.select_option("#range", "7d")
    await expect(page.locator("body")).to_have_attribute("data-ready", "1")

    html = await page.content()
    fetched = [await r.text() for r in responses]  # type: ignore[attr-defined]
    for secret in (dash.b.id, dash.b.name, *dash.b.key_ids, dash.a.key):
        assert secret not in html
        assert all(secret not in body for body in fetched)

    # CSV export of what is shown matches the cards
    href = await page.get_attribute("#csv", "href")
    rows = list(csv.DictReader(io.StringIO(await (await context.request.get(dash.url + href)).text())))
    assert sum(int(r["requests"]) for r in rows) == dash.a.requests
    assert sum(float(r["cost"]) for r in rows) == pytest.approx(dash.a.cost)
    by_key = await page.get_attribute("#csv-by-key", "href")
    keyed = list(csv.DictReader(io.StringIO(await (await context.request.get(dash.url + by_key)).text())))
    assert sorted(r["key_id"] for r in keyed) == sorted(dash.a.key_ids)
    assert sum(int(r["prompt_tokens"]) for r in keyed) == dash.a.prompt_tokens

    # sortable: clicking "Requests" twice puts the largest first
    header = page.locator("#series thead th", has_text="Requests")
    await header.click()
    await header.click()
    values = [int(v) for v in await page.locator("#series tbody tr td:nth-child(2)").evaluate_all(
        "cells => cells.map(c => c.dataset.value)")]
    assert values == sorted(values, reverse=True)

    await page.click("#logout")
    await page.wait_for_url("**/dashboard/login")
    assert (await context.request.get(dash.url + "/dashboard/api/me")).status == 401
    await page.goto(dash.url + "/dashboard")
    assert page.url.endswith("/dashboard/login")
    await context.close()


async def test_request_log_searches_opens_and_exports(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(50)
    await page.click("#more")
    await expect(page.locator("#requests tbody tr")).to_have_count(dash.a.requests)
    await expect(page.locator("#more")).to_be_hidden()
    times = await page.locator("#requests tbody tr td:first-child").evaluate_all(
        "cells => cells.map(c => Date.parse(c.dataset.value))")
    assert times == sorted(times, reverse=True)  # newest first, across pages
    await page.select_option("#status", "error")
    await page.click("#search")
    await expect(page.locator("#requests tbody tr")).to_have_count(dash.a.errors)
    await page.locator("#requests tbody tr").first.click()
    await expect(page.locator("#detail")).to_be_visible()
    assert "provider failed" in await page.inner_text("#detail-why")
    assert await page.inner_text("#detail-fields dd[data-field='status']") == "502"
    assert await page.inner_text("#detail-fields dd[data-field='tenant_id']") == dash.a.id
    await page.screenshot(path=str(tmp_path / "request-log.png"), full_page=True)
    request_id = await page.inner_text("#detail-id")
    await page.fill("#q", request_id[:12])
    await page.select_option("#status", "")
    await page.click("#search")
    await expect(page.locator("#requests tbody tr")).to_have_count(1)
    await page.fill("#q", "")
    await page.select_option("#status", "error")
    await page.click("#search")
    await expect(page.locator("#requests tbody tr")).to_have_count(dash.a.errors)
    href = await page.get_attribute("#csv-requests", "href")
    rows = list(csv.DictReader(io.StringIO(await (await context.request.get(dash.url + href)).text())))
    assert len(rows) == dash.a.errors and {r["tenant_id"] for r in rows} == {dash.a.id}
    assert all(int(r["status"]) >= 400 for r in rows)
    await context.close()


def _their_request_id(dash: DashEnv) -> str:
    """One of tenant B's request ids, as an admin's dashboard session sees it."""
    from tests.gateway.dashboard_fixtures import login

    with httpx.Client(base_url=dash.url) as admin:
        login(admin, ADMIN_KEY)
        page = admin.get("/dashboard/api/requests", params={"tenant_id": dash.b.id, "limit": 1}).json()
    return str(page["data"][0]["request_id"])


async def test_every_endpoint_the_pages_call_refuses_another_tenant(browser, dash: DashEnv) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    called: set[str] = set()
    page.on("request", lambda r: called.add(r.url) if "/dashboard/api/" in r.url else None)
    await sign_in(page, dash.url, dash.a.key)
    await page.click("#tab-requests")
    await expect(page.locator("#requests tbody tr")).to_have_count(50)
    await page.locator("#requests tbody tr").first.click()
    await expect(page.locator("#detail")).to_be_visible()
    await page.goto(dash.url + "/dashboard#operator")  # not for tenants: the usage view instead
    await page.wait_for_selector("body[data-ready='1']")
    assert await page.locator("#view-operator").is_hidden() and await page.locator("#tab-operator").is_hidden()
    paths = {urlsplit(u).path.removeprefix("/dashboard/api/").split("/")[0] for u in called}
    assert {"me", "summary", "limits", "requests"} <= paths

    their_id = _their_request_id(dash)
    for url in sorted(called):
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query)) | {"tenant_id": dash.b.id}
        got = await context.request.get(f"{dash.url}{parts.path}?{urlencode(query)}")
        if parts.path.endswith("/me"):
            assert got.ok and dash.b.id not in await got.text()
        else:
            assert got.status == 403, url
            assert (await got.json())["error"]["type"] == "permission_error"
    for path in (f"/dashboard/api/requests/{their_id}", f"/dashboard/api/requests/{their_id}?tenant_id={dash.a.id}"):
        got = await context.request.get(dash.url + path)
        assert got.status == 404 and their_id not in (await got.json())["error"]["message"].replace(their_id[:64], "")
    for path in ("overview", "deployments", "tenants"):
        assert (await context.request.get(f"{dash.url}/dashboard/api/{path}")).status == 403
    exported = await context.request.get(f"{dash.url}/dashboard/api/export.csv?table=requests&range=30d")
    assert dash.b.id not in await exported.text() and dash.a.id in await exported.text()
    await context.close()


async def test_operator_view_shows_all_tenants_spenders_budgets_and_circuits(  # type: ignore[no-untyped-def]
        browser, dash: DashEnv, tmp_path: Path) -> None:
    from playwright.async_api import expect

    async with httpx.AsyncClient(base_url=dash.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as client:
        set_limit = await client.put(f"/admin/v1/tenants/{dash.b.id}/limits",
                                     json={"cost_budget": round(dash.b.cost * 1.1, 6), "budget_period": "total"})
        assert set_limit.status_code == 200, set_limit.text
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await sign_in(page, dash.url, ADMIN_KEY)
    await page.click("#tab-operator")
    await expect(page.locator("#tenants tbody tr").filter(has_text=dash.b.name)).to_have_count(1)
    await page.wait_for_selector("body[data-ready='1']")
    await page.screenshot(path=str(tmp_path / "operator.png"), full_page=True)
    rows = await page.locator("#tenants tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells).map(c => c.dataset.value))")
    counts = {r[0]: int(r[2]) for r in rows}
    assert counts[dash.a.name] == dash.a.requests and counts[dash.b.name] == dash.b.requests
    for table in ("tenants", "deployments"):  # fractions shown as percentages, sorted by their values
        rates = await page.locator(f"#{table} tbody tr td:last-child").all_inner_texts()
        assert rates and all(r.endswith("%") for r in rates), rates
    spenders = await page.locator("#top-spenders tbody tr td:first-child").all_inner_texts()
    assert spenders[:2] == sorted([dash.a.name, dash.b.name], key=lambda n: -(dash.a.cost if n == dash.a.name
                                                                                 else dash.b.cost))
    near = page.locator("#budgets tbody tr").filter(has_text=dash.b.name).filter(has_text="cost")
    await expect(near).to_have_count(1)
    assert "yes" in await near.inner_text()
    assert await page.locator("#deployments tbody tr").count() >= 1
    states = await page.locator("#deployments tbody tr td:nth-child(4)").all_inner_texts()
    assert set(states) <= {"healthy", "open", "cooling", "held"}
    await check_chart(page, "chart-tenants", tmp_path / "operator-chart.png", expect_zeros=True)
    await context.close()


async def test_admin_switches_tenants(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, dash.url, ADMIN_KEY)
    await page.select_option("#tenant", dash.a.id)
    await expect(page.locator("#total-requests b")).to_have_attribute("data-value", str(dash.a.requests))
    await page.select_option("#tenant", dash.b.id)
    await expect(page.locator("#total-requests b")).to_have_attribute("data-value", str(dash.b.requests))
    assert int(await card(page, "prompt_tokens")) == dash.b.prompt_tokens
    assert dash.b.name in await page.inner_text("#who")
    await page.screenshot(path=str(tmp_path / "admin-tenant-b.png"), full_page=True)
    # the address keeps the view and its controls: a reload shows the same, a link opens a chosen one
    await page.reload()
    await page.wait_for_selector("body[data-ready='1']")
    assert await page.input_value("#tenant") == dash.b.id and int(await card(page, "requests")) == dash.b.requests
    await page.goto(f"{dash.url}/dashboard#usage?range=30d&split=model&tenant={dash.a.id}")
    await expect(page.locator("#total-requests b")).to_have_attribute("data-value", str(dash.a.requests))
    assert await page.input_value("#range") == "30d" and await page.input_value("#split") == "model"
    assert await page.evaluate("window.__sy.charts['chart-requests'].series.length") == 3
    await context.close()


async def test_phone_width_has_no_sideways_scroll(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    assert await page.evaluate("document.documentElement.scrollWidth") <= 391
    assert (await page.locator("#chart-tokens canvas").bounding_box())["width"] <= 390
    await context.close()
