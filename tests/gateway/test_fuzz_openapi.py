"""schemathesis against the OpenAPI schema the gateway serves: every public and admin operation,
called with an admin key, a tenant key and a bad key. No answer is a 5xx, content types match the
schema, every body (errors included) conforms to the schema, and client errors are OpenAI-shaped.

Stateful where it helps: besides the generated path parameters (which name nothing, so mostly get
404s), each case runs again against a tenant and a key that exist (and the served model), so the
operations on real resources (updates, limits, revocation, rotation) are fuzzed too. Hypothesis's
own state machines are not used: their rule choice depends on the server's answers, which it
reports as flaky data generation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance

from gateway.db import migrate
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def served(fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from gateway.app import create_app

    work = tmp_path_factory.mktemp("openapi")
    db_url = f"sqlite+aiosqlite:///{work / 'gw.db'}"
    migrate.upgrade(db_url)
    # The bad key fails on every operation: the failed-authentication throttle (tested on its own in
    # test_auth_abuse) would soon answer 429 to every key from loopback and hide the rest.
    auth = {"admin_key": ADMIN_KEY, "max_failures_per_address": 0, "max_failures_per_prefix": 0}
    settings_ = gateway_settings(fake_upstream_server.url, auth=auth, database={"url": db_url},
                                 usage={"journal_dir": str(work / "journal")})
    with ServerThread(create_app(settings_)) as server:
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
            tid = admin.post("/admin/v1/tenants", json={"name": f"s-{uuid.uuid4().hex[:6]}"}).json()["id"]
            tenant_key = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()["key"]
            # What the stateful pass aims at: another tenant and key, so the caller's key survives.
            target = admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"}).json()["id"]
            target_key = admin.post("/admin/v1/keys", json={"tenant_id": target}).json()["id"]
        yield {"url": server.url, "admin": ADMIN_KEY, "tenant": tenant_key, "bad": "sk-not-a-real-key",
               "tenant_id": target, "key_id": target_key, "model_id": "echo"}


CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
EXISTING = ("tenant_id", "key_id", "model_id")  # path parameters the stateful pass points at real things


def test_no_operation_fails_or_breaks_its_schema(served: dict[str, str], upstream: FakeUpstream) -> None:
    api = schemathesis.openapi.from_url(served["url"] + "/schema/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    paths = {op.path for op in operations}
    assert "/v1/chat/completions" in paths and any(p.startswith("/admin/") for p in paths)
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def run(case: Any) -> None:
            for who in ("admin", "tenant", "bad"):
                call(case, who)
            params = case.path_parameters or {}
            if any(name in params for name in EXISTING):
                case.path_parameters = {k: served[k] if k in EXISTING else v for k, v in params.items()}
                for who in ("admin", "tenant"):
                    call(case, who)

        def call(case: Any, who: str) -> None:
            response = case.call_and_validate(base_url=served["url"], checks=CHECKS,
                                              headers={"authorization": f"Bearer {served[who]}"})
            if 400 <= response.status_code < 500 and "json" in response.headers.get("content-type", [""])[0]:
                error = response.json()["error"]  # every client error in OpenAI's shape
                assert isinstance(error["message"], str) and isinstance(error["type"], str)

        try:
            run()
        except BaseException as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:300]}")
    assert not failures, "\n\n".join(failures)
