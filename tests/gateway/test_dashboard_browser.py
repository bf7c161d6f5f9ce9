"""The dashboard in headless Chromium (Debian's, driven by Playwright; no browser download):
tenant A signs in, sees its seeded totals in cards, charts and tables, nothing of tenant B on
the page or in any JSON the page fetched; CSV export matches; sorting; logout; the admin switches
tenants; phone width has no sideways scrolling. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.dashboard_fixtures import DashEnv, dash  # noqa: F401

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


async def test_tenant_sees_only_its_own_usage(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    responses: list[object] = []
    page.on("response", lambda r: responses.append(r) if "/dashboard/api/" in r.url else None)
    await sign_in(page, dash.url, dash.a.key)
    await page.screenshot(path=str(tmp_path / "tenant-a.png"), full_page=True)
    assert int(await card(page, "requests")) == dash.a.requests
    assert int(await card(page, "errors")) == dash.a.errors
    assert int(await card(page, "total_tokens")) == dash.a.prompt_tokens + dash.a.completion_tokens
    assert float(await card(page, "cost")) == pytest.approx(dash.a.cost)
    assert await page.locator("#chart-requests canvas").count() == 1
    assert await page.locator("#chart-cost canvas").count() == 1
    keys = await page.locator("#by-key tbody tr td:first-child").all_inner_texts()
    assert sorted(keys) == sorted(dash.a.key_ids)
    html = await page.content()
    fetched = [await r.text() for r in responses]  # type: ignore[attr-defined]
    for secret in (dash.b.id, dash.b.name, *dash.b.key_ids, dash.a.key):
        assert secret not in html
        assert all(secret not in body for body in fetched)
    assert fetched

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
    assert await page.locator("#deployments tbody tr").count() >= 1
    await page.screenshot(path=str(tmp_path / "admin-tenant-b.png"), full_page=True)
    await context.close()


async def test_phone_width_has_no_sideways_scroll(browser, dash: DashEnv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = await context.new_page()
    await sign_in(page, dash.url, dash.a.key)
    await page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    assert await page.evaluate("document.documentElement.scrollWidth") <= 391
    assert (await page.locator("#chart-tokens canvas").bounding_box())["width"] <= 390
    await context.close()
