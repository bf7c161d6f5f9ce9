"""A background response streamed (``background: true``, ``stream: true``) is held from its first
event, as one answered ``queued`` is: its client (or another of its tenant) can retrieve or cancel it
while it streams, and it is metered once, in a usage row of its own, the request that started it
settled at no tokens: by its stream when the client reads it to its last event (with what the stream
carried), else (the client gone before it) with the upstream's usage once it ends upstream. One the
gateway ends before its last event (its upstream's connection broken, the process draining) ends
with an ``error`` event saying it still runs and how to resume its stream, not with a status it does
not have."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway import streaming
from gateway.db import Database
from tests.gateway.tenancy_fixtures import db  # noqa: F401
from tests.gateway.test_responses_background_resume import polled  # noqa: F401
from tests.gateway.test_responses_background_usage import PRICE, _metered, _started, followed, native  # noqa: F401
from tests.gateway.test_responses_store import Gateway
from tests.support.doubles import CutAfter
from tests.support.fake_responses import BREAK_PART_WAY, BROKEN_AFTER, USAGE, FakeResponsesUpstream


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


def _spent_once(db: Database, tenant: str, outcome: str | None) -> None:
    """The tenant's usage rows: its request's, at no tokens, and its response's, USAGE at its price,
    ended ``outcome`` (its ``error_type``: None when it completed)."""
    started, ended = _metered(db, tenant)
    assert (started.prompt_tokens, started.completion_tokens, started.cost) == (0, 0, 0)
    assert (ended.prompt_tokens, ended.completion_tokens, ended.cached_tokens) == (
        USAGE["input_tokens"], USAGE["output_tokens"], 2)
    assert ended.exact and ended.cost == pytest.approx(10 * PRICE / 1e6) and ended.model == "native"
    assert ended.error_type == outcome and ended.endpoint == "responses"


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
    _spent_once(db, tenant, None)
    assert client.responses.retrieve(response_id).status == "completed"  # stored finished by the follower
    _counted_once(followed, tenant, client)


def test_a_stream_read_to_its_end_is_metered_once(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as events:
        for event in events:
            if event.type == "response.created":
                native.finish(event.response.id)  # it ends while the client reads on
    assert event.type == "response.completed"
    _spent_once(db, tenant, None)  # by its stream, or by the follower if it found it ended first
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
    _spent_once(db, tenant, "cancelled")
    assert client.responses.retrieve(final["response"]["id"]).status == "cancelled"
    _counted_once(followed, tenant, client)


def test_a_stream_cancelled_through_the_gateway_ends_cancelled_and_is_metered_once(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as stream:
        events = iter(stream)
        created = next(events)
        response_id = created.response.id
        native.held[response_id] |= {"usage": USAGE}  # what it spent before the cancel
        cancelled = client.responses.cancel(response_id)  # while it streams: held since its first event
        assert cancelled.status == "cancelled" and cancelled.model == "native"
        assert ("POST", f"/v1/responses/{response_id}/cancel") in native.reached
        rest = [event.to_dict() for event in events]
    final = rest[-1]  # an event the SDK has no type of
    assert final["type"] == "response.cancelled" and final["response"]["status"] == "cancelled"
    assert final["response"]["model"] == "native"
    assert client.responses.retrieve(response_id).status == "cancelled"
    _spent_once(db, tenant, "cancelled")
    _counted_once(followed, tenant, client)


def test_a_stream_is_retrieved_from_its_upstream_while_it_runs(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = _budgeted(followed)
    key = followed.admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()["key"]
    colleague = openai.OpenAI(base_url=followed.url + "/v1", api_key=key, max_retries=0, timeout=20)
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as stream:
        events = iter(stream)
        created = next(events)
        response_id = created.response.id
        asked = len(native.reached)
        running = colleague.responses.retrieve(response_id)  # another key of the tenant, while it streams
        assert (running.id, running.status, running.model) == (response_id, "in_progress", "native")
        assert ("GET", f"/v1/responses/{response_id}") in native.reached[asked:]
        with pytest.raises(openai.NotFoundError):  # another tenant's: never passed on
            followed.tenant_client().responses.retrieve(response_id)
        native.finish(response_id)
        rest = list(events)
    assert rest[-1].type == "response.completed" and rest[-1].response.output_text == "work"
    assert colleague.responses.retrieve(response_id).status == "completed"
    _spent_once(db, tenant, None)
    _counted_once(followed, tenant, client)


def _cut_says_it_runs_on(events: list[Any], code: str, response_id: str) -> int:
    """A stream of ``response_id`` the gateway cut: its last event an ``error`` (``code``) telling how
    to resume it, no event claiming the response failed or is incomplete; the last number relayed."""
    *relayed, error = events
    assert not {"response.failed", "response.incomplete"} & {event.type for event in events}
    last = relayed[-1].sequence_number
    assert [event.sequence_number for event in events] == list(range(relayed[0].sequence_number, last + 2))
    assert (error.type, error.code, error.param) == ("error", code, None)
    assert "still running" in error.message
    assert f"GET /v1/responses/{response_id}?stream=true&starting_after={last}," in error.message
    return last


def _resumed(client: openai.OpenAI, native: FakeResponsesUpstream, response_id: str, last: int) -> None:
    """The stream resumed after event ``last``: the rest of it, the response ending while it is read."""
    assert client.responses.retrieve(response_id).status in ("queued", "in_progress")  # held: it runs on
    rest = []
    with client.responses.retrieve(response_id, stream=True, starting_after=last) as events:
        for event in events:
            rest.append(event)
            if len(rest) == 1:
                native.finish(response_id)
    assert [event.sequence_number for event in rest] == list(range(last + 1, last + 1 + len(rest)))
    assert rest[-1].type == "response.completed" and rest[-1].response.model == "native"


def test_a_stream_whose_upstream_connection_breaks_says_it_runs_on_and_resumes(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = polled.tenant()
    with client.responses.create(model="native", input=BREAK_PART_WAY, background=True, stream=True,
                                 max_output_tokens=2) as stream:
        events: list[Any] = list(stream)
    response_id = events[0].response.id
    last = _cut_says_it_runs_on(events, "upstream_unavailable", response_id)
    assert last == BROKEN_AFTER - 1
    _resumed(client, native, response_id, last)
    assert client.responses.retrieve(response_id).output_text == BREAK_PART_WAY
    _spent_once(db, tenant, None)


def test_a_stream_the_drain_cuts_says_it_runs_on_and_resumes(
        polled: Gateway, db: Database, native: FakeResponsesUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant, client = polled.tenant()
    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=2))
    with client.responses.create(model="native", input="work", background=True, stream=True,
                                 max_output_tokens=2) as stream:
        events: list[Any] = list(stream)
    monkeypatch.undo()  # no drain under way: the resumed stream is not cut
    response_id = events[0].response.id
    last = _cut_says_it_runs_on(events, "server_shutting_down", response_id)
    assert last == 2
    _resumed(client, native, response_id, last)
    _spent_once(db, tenant, None)


def test_a_resumed_stream_the_drain_cuts_says_it_runs_on(
        polled: Gateway, db: Database, native: FakeResponsesUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant, client, response_id = _started(polled)
    monkeypatch.setattr(streaming, "DRAIN", CutAfter(reads=1))
    with client.responses.retrieve(response_id, stream=True, starting_after=1) as stream:
        events: list[Any] = list(stream)
    monkeypatch.undo()
    assert _cut_says_it_runs_on(events, "server_shutting_down", response_id) == 3
    _metered(db, tenant, rows=1)  # its starting request's alone: the response is metered when it ends
    _resumed(client, native, response_id, 3)
    _spent_once(db, tenant, None)


def test_a_broken_stream_of_a_response_not_stored_still_fails(polled: Gateway) -> None:
    """Not stored (``store: false``), a background response is not held: its broken stream ends failed."""
    _, client = polled.tenant()
    with client.responses.create(model="native", input=BREAK_PART_WAY, background=True, stream=True,
                                 store=False, max_output_tokens=2) as stream:
        events: list[Any] = list(stream)
    assert [event.type for event in events][-2:] == ["error", "response.failed"]
    assert events[-2].code == "upstream_unavailable" and "still running" not in events[-2].message
