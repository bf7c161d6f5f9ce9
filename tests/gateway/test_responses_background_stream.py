"""A background response streamed (``background: true``, ``stream: true``) is metered once: by its
stream when the client reads it to its last event, else (the client gone before it) as one answered
``queued`` is, with the upstream's usage once it ends upstream, the request that started it settled
at no tokens."""

from __future__ import annotations

import openai
import pytest

from gateway.db import Database
from gateway.db.models import UsageRow
from tests.gateway.tenancy_fixtures import db  # noqa: F401
from tests.gateway.test_responses_background_usage import PRICE, _metered, followed, native  # noqa: F401
from tests.gateway.test_responses_store import Gateway
from tests.support.fake_responses import USAGE, FakeResponsesUpstream


def _budgeted(gateway: Gateway) -> tuple[str, openai.OpenAI]:
    """A tenant with a token budget (160) the streamed request (reserving 154) fits."""
    tenant, client = gateway.tenant()
    gateway.admin.patch(f"/admin/v1/tenants/{tenant}/limits",
                        json={"token_budget": 160, "budget_period": "total"}).raise_for_status()
    return tenant, client


def _counted_once(gateway: Gateway, tenant: str, client: openai.OpenAI) -> None:
    """The tenant's budget counts USAGE's 10 tokens, once: with a budget of 145 the next request
    (reserving 140) is refused, with one of 150 admitted."""
    gateway.admin.patch(f"/admin/v1/tenants/{tenant}/limits", json={"token_budget": 145}).raise_for_status()
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
    assert "token budget" in refused.value.message
    gateway.admin.patch(f"/admin/v1/tenants/{tenant}/limits", json={"token_budget": 150}).raise_for_status()
    queued = client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
    assert queued.status == "queued"


def _spent_all(row: UsageRow) -> None:
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (
        USAGE["input_tokens"], USAGE["output_tokens"], 2)
    assert row.exact and row.cost == pytest.approx(10 * PRICE / 1e6) and row.model == "native"


def test_a_stream_the_client_left_is_metered_once_when_it_ends_upstream(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as events:
        created = next(events)
        assert created.type == "response.created" and created.response.status == "in_progress"
        next(events)  # the client goes away: the upstream runs it on
    response_id = created.response.id
    native.finish(response_id)
    started, ended = _metered(db, tenant)
    assert (started.prompt_tokens, started.completion_tokens, started.cost) == (0, 0, 0)
    _spent_all(ended)
    assert ended.error_type is None and ended.endpoint == "responses"
    assert client.responses.retrieve(response_id).status == "completed"  # stored finished by the follower
    _counted_once(followed, tenant, client)


def test_a_stream_read_to_its_end_is_metered_once_by_it(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as events:
        for event in events:
            if event.type == "response.created":
                native.finish(event.response.id)  # it ends while the client reads on
    assert event.type == "response.completed"
    (row,) = _metered(db, tenant, rows=1)
    _spent_all(row)
    assert client.responses.retrieve(event.response.id).status == "completed"
    _counted_once(followed, tenant, client)


def test_a_stream_that_ends_cancelled_is_stored_and_metered_by_it(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as events:
        for event in events:
            if event.type == "response.created":  # cancelled upstream while the client reads on
                native.held[event.response.id] |= {"status": "cancelled", "usage": USAGE}
    final = event.to_dict()  # its last event, one the SDK has no type of: no error after it
    assert final["type"] == "response.cancelled" and final["response"]["model"] == "native"
    (row,) = _metered(db, tenant, rows=1)
    _spent_all(row)
    assert client.responses.retrieve(final["response"]["id"]).status == "cancelled"
    _counted_once(followed, tenant, client)
