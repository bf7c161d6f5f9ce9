"""Hostile parameters on the dashboard (PostgreSQL): dates at the ends of the calendar and NUL
characters are a 400 in OpenAI's error shape naming the parameter, never a 500, and the CSV export
refuses them before its 200 and its first byte; the HTML pages carry one charset."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.dashboard.ranges import Range
from gateway.errors import ParameterError
from tests.gateway.dashboard_fixtures import DashEnv, dash, login  # noqa: F401


@pytest.fixture
def a_client(dash: DashEnv) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dash.url, timeout=20) as client:
        assert login(client, dash.a.key).status_code == 303
        yield client


def _assert_400(response: httpx.Response, param: str) -> None:
    assert response.status_code == 400, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and "\x00" not in error["message"]


@pytest.mark.parametrize(("path", "param"), [
    ("/dashboard/api/summary?end=9999-12-31", "end"),
    ("/dashboard/api/summary?end=0001-01-02", "end"),
    ("/dashboard/api/summary?start=0001-01-01&end=0001-01-02", "start"),
    ("/dashboard/api/summary?start=9999-12-31T20:00:00Z&end=9999-12-31T23:59:00Z&bucket=hour", "start"),
    ("/dashboard/api/summary?start=9999-12-31T20:00:00&end=9999-12-31T23:00:00&tz=America/New_York", "end"),
    ("/dashboard/api/requests?end=9999-12-31", "end"),
    ("/dashboard/api/export.csv?end=9999-12-31", "end"),
    ("/dashboard/api/export.csv?table=requests&end=9999-12-31", "end"),
])
def test_dates_at_the_ends_of_the_calendar_are_a_400(a_client: httpx.Client, path: str, param: str) -> None:
    _assert_400(a_client.get(path), param)


@pytest.mark.parametrize(("path", "param"), [
    ("/dashboard/api/requests?q=%00", "q"),
    ("/dashboard/api/requests?model=ab%00", "model"),
    ("/dashboard/api/requests?key_id=%00", "key_id"),
    ("/dashboard/api/requests/ab%00cd", "request_id"),
    ("/dashboard/api/summary?range=1h&tenant_id=%00", "tenant_id"),
    ("/dashboard/api/export.csv?table=requests&q=%00", "q"),
])
def test_nul_in_a_parameter_is_a_400_naming_it(a_client: httpx.Client, path: str, param: str) -> None:
    _assert_400(a_client.get(path), param)


@pytest.mark.parametrize("cursor", [
    "9999-12-31T23:59:59.999999-01:00~1",  # a time past the calendar's end in UTC
    "2026-01-01T00:00:00+00:00~99999999999999999999999",  # a row id past 64 bits
])
def test_a_forged_paging_cursor_is_a_400_naming_before(a_client: httpx.Client, cursor: str) -> None:
    _assert_400(a_client.get("/dashboard/api/requests", params={"before": cursor}), "before")


def test_the_request_export_answers_errors_before_it_starts(a_client: httpx.Client) -> None:
    """A refused export is a whole JSON error, not a 200 whose CSV body breaks off."""
    with a_client.stream("GET", "/dashboard/api/export.csv?table=requests&q=%00") as response:
        body = response.read()
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json"), body
    ok = a_client.get("/dashboard/api/export.csv", params={"table": "requests", "range": "30d"})
    assert ok.status_code == 200 and ok.text.startswith("request_id,")


def test_a_range_near_the_calendar_end_is_still_served(a_client: httpx.Client) -> None:
    response = a_client.get("/dashboard/api/summary", params={"start": "9999-12-20", "end": "9999-12-27"})
    assert response.status_code == 200, response.text


def test_a_custom_week_ending_on_a_dst_day_has_seven_days(a_client: httpx.Client) -> None:
    params = {"start": "2025-03-03", "end": "2025-03-09", "tz": "America/New_York", "bucket": "day"}
    data = a_client.get("/dashboard/api/summary", params=params).json()
    assert data["end"] == "2025-03-10T04:00:00+00:00" and len(data["series"]) == 7
    rows = a_client.get("/dashboard/api/export.csv", params=params).text.splitlines()
    assert len(rows) == 1 + 7


def test_range_parse_names_the_parameter_instead_of_overflowing() -> None:
    for end in ("9999-12-31", "0001-01-02", "9999-12-31T23:59:59"):
        with pytest.raises(ParameterError) as raised:
            Range.parse(None, end, None)
        assert raised.value.param == "end"


def test_html_pages_carry_one_charset(dash: DashEnv, a_client: httpx.Client) -> None:
    with httpx.Client(base_url=dash.url) as client:
        assert client.get("/dashboard/login").headers["content-type"] == "text/html; charset=utf-8"
    assert a_client.get("/dashboard/").headers["content-type"] == "text/html; charset=utf-8"
