"""Requests about a stored response (``GET``, its event stream, ``cancel``, ``DELETE``, ``input_items``)
count against the requests/min of the key and its tenant, as every request does at OpenAI: over it,
a 429 in OpenAI's shape with ``Retry-After`` and ``x-ratelimit-*`` headers, the upstream not asked.
A count of a request's input tokens (``POST /v1/responses/input_tokens``) is such a request too.
Nothing else of the quotas refuses them (a spent budget still reads and cancels what it started) and
they add nothing to tokens/min. One admitted and answered with an error carries the ``x-ratelimit-*``
headers too, and one refused is metered as a refused request is: a usage row. The openai SDK against
the real app, its quotas counted in process and in Redis, and a loopback upstream serving Responses."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, migrated_pg_url  # noqa: F401
from tests.support.fake_responses import ECHO_ERROR_OBJECT, INPUT_TOKENS, USAGE, FakeResponsesUpstream
from tests.support.servers import ServerThread
from tests.support.usage_rows import usage_row

PRICE = 100.0  # USD per million tokens, input and output: USAGE's 10 tokens cost 0.001


class Gateway:
    def __init__(self, url: str, admin: httpx.Client) -> None:
        self.url, self.admin = url, admin

    def client(self, limits: dict[str, Any]) -> openai.OpenAI:
        """A client of a new key of a new tenant, the key's limits ``limits``."""
        tenant = self.admin.post("/admin/v1/tenants", json={"name": f"p-{uuid.uuid4().hex[:8]}"}).json()["id"]
        key = self.admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()
        self.admin.put(f"/admin/v1/keys/{key['id']}/limits", json=limits).raise_for_status()
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key["key"], max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def native() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    server.id_prefix = f"resp_up_{uuid.uuid4().hex[:8]}_"  # a charge is made once per id: in Redis, for days
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest, migrated_pg_url: str, native: FakeResponsesUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    deployment = {"provider": "openai", "model": "up-model", "api_base": native.url, "api_key": "sk-up",
                  "responses_api": True}
    settings = gateway_settings(
        native.url, database={"url": migrated_pg_url}, usage={"journal_dir": str(tmp_path_factory.mktemp("journal"))},
        models=[{"name": "native", "deployments": [deployment]}],
        prices={"native": {"input_per_million": PRICE, "output_per_million": PRICE}},
        **({"redis": {"url": REDIS_URL}} if request.param == "redis" else {}))
    settings.usage.background_poll_seconds = 3600.0  # no follower during a test: the clients find them ended
    with ServerThread(create_app(settings)) as server, httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin:
        yield Gateway(server.url, admin)


def _started(client: openai.OpenAI) -> str:
    """A background response the key started (a request reserving 140 tokens, 0.014 USD)."""
    queued = client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
    assert queued.status == "queued"
    return queued.id


def _assert_refused(refused: pytest.ExceptionInfo[openai.RateLimitError], limit: int) -> None:
    assert refused.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert refused.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert "requests per minute" in refused.value.message
    headers = refused.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == (str(limit), "0")


def test_requests_about_a_stored_response_count_against_requests_per_minute(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.client({"requests_per_minute": 6})
    response_id = _started(client)  # 1
    seen = [client.responses.with_raw_response.retrieve(response_id).headers for _ in range(2)]  # 2, 3
    assert [(h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) for h in seen] == [
        ("6", "4"), ("6", "3")]
    assert seen[0]["x-ratelimit-reset-requests"]
    assert client.responses.input_items.list(response_id).data  # 4
    with client.responses.retrieve(response_id, stream=True) as events:  # 5
        assert next(iter(events)).type == "response.created"
    assert client.responses.cancel(response_id).status == "cancelled"  # 6
    asked = len(native.reached)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.retrieve(response_id)
    _assert_refused(refused, 6)
    for over in (lambda: client.responses.retrieve(response_id, stream=True),
                 lambda: client.responses.cancel(response_id),
                 lambda: client.responses.input_items.list(response_id),
                 lambda: client.responses.delete(response_id),
                 lambda: client.responses.retrieve("resp_unknown"),
                 lambda: client.responses.create(model="native", input="more")):
        with pytest.raises(openai.RateLimitError) as refused:
            over()
        _assert_refused(refused, 6)
    assert len(native.reached) == asked  # refused before the upstream is asked


@pytest.mark.parametrize("budget", [{"token_budget": 145}, {"cost_budget": 0.0145}], ids=["tokens", "money"])
def test_a_key_whose_budget_is_spent_still_reads_and_cancels_what_it_started(
        gateway: Gateway, native: FakeResponsesUpstream, budget: dict[str, Any]) -> None:
    client = gateway.client(budget | {"budget_period": "total", "requests_per_minute": 100})
    first, second = _started(client), _started(client)  # each settled at nothing: the budget is whole
    native.finish(first)
    assert client.responses.retrieve(first).status == "completed"  # metered: USAGE's 10 tokens, 0.001 USD
    with pytest.raises(openai.RateLimitError) as spent:  # too little left for another (140 tokens, 0.014 USD)
        _started(client)
    assert spent.value.code == "insufficient_quota"
    polled = client.responses.with_raw_response.retrieve(second)
    assert polled.parse().status == "queued" and polled.headers["x-ratelimit-limit-requests"] == "100"
    native.held[second] |= {"usage": USAGE}  # what it spent before the cancel
    assert client.responses.cancel(second).status == "cancelled"  # metered: the budget is over-spent now
    assert client.responses.retrieve(second).status == "cancelled"
    assert client.responses.retrieve(first).output_text == "work"
    assert [item.type for item in client.responses.input_items.list(first).data] == ["message"]
    client.responses.delete(first)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first)


def test_polls_add_nothing_to_tokens_per_minute(gateway: Gateway) -> None:
    client = gateway.client({"tokens_per_minute": 140, "requests_per_minute": 100})
    response_id = _started(client)  # settled at no tokens: its spend is metered when it ends
    remaining = [client.responses.with_raw_response.retrieve(response_id).headers["x-ratelimit-remaining-tokens"]
                 for _ in range(5)]
    assert remaining == ["140"] * 5
    assert client.responses.create(model="native", input="work", background=True, max_output_tokens=2).id


def test_a_count_of_input_tokens_is_a_poll(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """``POST /v1/responses/input_tokens`` counts against requests/min, as ``/v1/messages/count_tokens``
    would: its headers, then a 429 (the upstream not asked); a long input reserves no tokens/min."""
    client = gateway.client({"requests_per_minute": 2, "tokens_per_minute": 140})
    counted = client.responses.input_tokens.with_raw_response.count(model="native", input="many words " * 500)
    assert counted.parse().input_tokens == INPUT_TOKENS
    headers = counted.headers
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"],
            headers["x-ratelimit-remaining-tokens"]) == ("2", "1", "140")
    client.responses.input_tokens.count(model="native", input="again")
    asked = len(native.counted)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.input_tokens.count(model="native", input="once more")
    _assert_refused(refused, 2)
    assert len(native.counted) == asked


def _failed_with_headers(request: Callable[[], object]) -> tuple[int, tuple[str, str]]:
    """The status of ``request``'s error answer, and its requests/min limit and what is left of it."""
    with pytest.raises(openai.APIStatusError) as failed:
        request()
    headers = failed.value.response.headers
    return failed.value.status_code, (headers.get("x-ratelimit-limit-requests", ""),
                                      headers.get("x-ratelimit-remaining-requests", ""))


def test_an_admitted_polls_error_carries_the_ratelimit_headers(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    """As a request's error after its admission does (an upstream's failure), and as the poll's answer would."""
    client = gateway.client({"requests_per_minute": 20})
    held = _started(client)  # 1
    done = client.responses.create(model="native", input="done")  # 2: kept, completed
    assert _failed_with_headers(lambda: client.responses.create(model="native", input=ECHO_ERROR_OBJECT)) == (
        503, ("20", "17"))
    polls = [lambda: client.responses.retrieve("resp_unknown"),
             lambda: client.responses.delete("resp_unknown"),
             lambda: client.responses.input_items.list("resp_unknown"),
             lambda: client.responses.input_items.list(done.id, after="item_unknown"),
             lambda: client.responses.cancel(done.id),  # not running in the background
             lambda: client.responses.retrieve(done.id, stream=True)]
    answers = [_failed_with_headers(poll) for poll in polls]
    assert answers == [(404, ("20", "16")), (404, ("20", "15")), (404, ("20", "14")), (400, ("20", "13")),
                       (400, ("20", "12")), (400, ("20", "11"))]
    native.reach_failure = 500
    try:
        status, left = _failed_with_headers(lambda: client.responses.retrieve(held))
    finally:
        native.reach_failure = None
    assert status >= 500 and left == ("20", "10")


async def _rows(url: str, request_ids: list[str]) -> list[UsageRow]:
    db = Database.from_url(url)
    try:
        return [await usage_row(db, rid) for rid in request_ids]
    finally:
        await db.dispose()


def test_a_refused_poll_is_metered_as_a_refused_request_is(gateway: Gateway, migrated_pg_url: str) -> None:
    """One usage row each, of no tokens, with the refusal's status and kind; a poll names no model."""
    client = gateway.client({"requests_per_minute": 1})
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    refused = []
    for over in (lambda: client.responses.create(model="native", input="more"),
                 lambda: client.responses.retrieve("resp_unknown")):
        with pytest.raises(openai.RateLimitError) as err:
            over()
        refused.append(err.value.response.headers["x-request-id"])
    rows = asyncio.run(_rows(migrated_pg_url, refused))
    assert [(r.status, r.error_type, r.endpoint, r.model) for r in rows] == [
        (429, "rate_limit_exceeded", "responses", "native"), (429, "rate_limit_exceeded", "responses", "")]
    assert all((r.prompt_tokens, r.completion_tokens, r.cost, r.key_id) == (0, 0, 0, rows[0].key_id) for r in rows)
