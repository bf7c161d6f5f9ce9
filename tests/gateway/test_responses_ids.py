"""A NUL in a stored response's id in a path (``GET``/``DELETE /v1/responses/{id}``, ``input_items``)
is a 400 naming it on SQLite and PostgreSQL alike, never a database error (PostgreSQL text cannot
hold one: it was a 500 there)."""

from __future__ import annotations

import pytest

from tests.gateway.tenancy_fixtures import db, plain_url  # noqa: F401
from tests.gateway.test_responses_store import Gateway, gateway, responses_upstream  # noqa: F401


@pytest.mark.parametrize("method, suffix", [("GET", ""), ("DELETE", ""), ("GET", "/input_items")])
def test_a_nul_in_a_response_id_is_a_400_naming_it(gateway: Gateway, method: str, suffix: str) -> None:
    key = gateway.admin.post("/admin/v1/keys", json={"tenant_id": gateway.admin.post(
        "/admin/v1/tenants", json={"name": f"nul-{method}{suffix}"}).json()["id"]}).json()["key"]
    r = gateway.admin.request(method, f"/v1/responses/resp_a%00b{suffix}", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_id"
