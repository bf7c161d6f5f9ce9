"""A background response still running upstream is streamed again through the gateway (``GET
/v1/responses/{id}?stream=true``, OpenAI's stream-and-reconnect): the upstream's events after
``starting_after``, the query passed on as sent; its last event stores it finished and it is metered
once, whoever else (a poll, a cancel, the follower) sees it end. One stored finished cannot be
streamed (a 400), another tenant's is a 404, and so is one the upstream no longer knows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs

import httpx
import openai
import pytest

from gateway.db import Database
from tests.gateway.tenancy_fixtures import db  # noqa: F401
from tests.gateway.test_responses_background_usage import (  # noqa: F401
    _assert_spent,
    _metered,
    _served,
    _started,
    followed,
    native,
)
from tests.gateway.test_responses_store import Gateway
from tests.support.fake_responses import USAGE, FakeResponsesUpstream

ENCRYPTED = "reasoning.encrypted_content"


@pytest.fixture(scope="module")
def polled(db: Database, native: FakeResponsesUpstream,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose follower does not pass during a test: only the clients find a response ended."""
    with _served(db, native, str(tmp_path_factory.mktemp("journal")), 3600.0) as served:
        yield served


def test_a_stream_resumed_after_an_event_ends_it_stored_and_metered_once(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(polled)
    seen = []
    with client.responses.retrieve(response_id, stream=True, starting_after=3, include=[ENCRYPTED]) as events:
        for event in events:
            seen.append(event)
            if len(seen) == 1:
                native.finish(response_id)  # it ends while the client reads on
    assert parse_qs(native.queries[-1]) == {"stream": ["true"], "starting_after": ["3"], "include[]": [ENCRYPTED]}
    assert [event.sequence_number for event in seen] == list(range(4, 4 + len(seen)))
    assert seen[0].type == "response.output_item.added"
    final = seen[-1]
    assert final.type == "response.completed" and final.response.status == "completed"
    assert final.response.model == "native" and final.response.output_text == "work"
    asked = len(native.reached)
    stored = client.responses.retrieve(response_id)  # stored finished by the stream: the upstream not asked
    assert stored.status == "completed" and stored.output_text == "work" and stored.model == "native"
    assert len(native.reached) == asked
    with pytest.raises(openai.BadRequestError) as again:  # stored: no stream to replay
        client.responses.retrieve(response_id, stream=True)
    assert again.value.param == "stream" and again.value.code == "unsupported_parameter"
    assert again.value.body["message"].startswith("a stored response cannot be streamed")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as included:
        client.responses.retrieve(response_id, include=[ENCRYPTED])
    assert included.value.param == "include"
    assert len(native.reached) == asked
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")


def test_a_stream_that_ends_cancelled_is_metered_once_as_cancelled(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(polled)
    native.held[response_id] |= {"usage": USAGE}  # what it spent before the cancel
    with client.responses.retrieve(response_id, stream=True, starting_after=1) as events:
        seen = [next(iter(events))]
        assert client.responses.cancel(response_id).status == "cancelled"  # stored and metered by the cancel
        seen += list(events)
    final = seen[-1].to_dict()  # an event the SDK has no type of
    assert final["type"] == "response.cancelled" and final["response"]["status"] == "cancelled"
    assert final["response"]["model"] == "native" and final["sequence_number"] == seen[-2].sequence_number + 1
    assert client.responses.retrieve(response_id).status == "cancelled"
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "cancelled")


def test_a_stream_the_client_leaves_before_the_end_meters_nothing(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(polled)
    with client.responses.retrieve(response_id, stream=True) as events:
        assert next(iter(events)).type == "response.created"  # then the client goes away
    _metered(db, tenant, rows=1)  # its starting request's alone
    assert client.responses.retrieve(response_id).status == "queued"  # still held: asked of the upstream
    native.finish(response_id)
    assert client.responses.retrieve(response_id).status == "completed"
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")


def test_a_stream_resumed_after_its_last_event_is_an_empty_event_stream(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    """Nothing after ``starting_after`` (the response ended upstream, its last event numbered that):
    a 200 event stream that ends at once, as the upstream's; the response is metered once, by the
    poll that finds it ended."""
    tenant, client, response_id = _started(polled)
    native.finish(response_id)  # it ends upstream; the gateway does not know yet
    with httpx.stream("GET", f"{native.url}/responses/{response_id}?stream=true") as direct:
        last = max(json.loads(line[5:])["sequence_number"] for line in direct.iter_lines() if line.startswith("data:"))
    with client.responses.with_streaming_response.retrieve(response_id, stream=True, starting_after=last) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        assert list(answer.parse()) == []
    assert parse_qs(native.queries[-1]) == {"stream": ["true"], "starting_after": [str(last)]}
    assert client.responses.retrieve(response_id).status == "completed"  # still held: the poll finds it ended
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")


def test_a_stream_answered_with_no_event_stream_is_a_clear_error(
        polled: Gateway, native: FakeResponsesUpstream) -> None:
    _, client, response_id = _started(polled)
    native.streams_as_json = True  # a GET with stream=true is answered with the response as JSON
    try:
        with pytest.raises(openai.APIStatusError) as failed:
            client.responses.retrieve(response_id, stream=True, starting_after=1)
    finally:
        native.streams_as_json = False
    assert failed.value.status_code == 502 and "not an event stream" in failed.value.message
    assert client.responses.retrieve(response_id).status == "queued"  # still held


def test_another_tenants_or_a_forgotten_response_is_a_404(
        polled: Gateway, native: FakeResponsesUpstream) -> None:
    _, alice, response_id = _started(polled)
    mallory = polled.tenant_client()
    asked = len(native.reached)
    with pytest.raises(openai.NotFoundError) as hidden:
        mallory.responses.retrieve(response_id, stream=True, starting_after=0)
    assert hidden.value.code == "not_found" and len(native.reached) == asked  # never passed on
    del native.held[response_id]  # the upstream forgot it: a 404 for its id
    with pytest.raises(openai.NotFoundError) as forgotten:
        alice.responses.retrieve(response_id, stream=True)
    assert forgotten.value.code == "not_found" and native.reached[-1] == ("GET", f"/v1/responses/{response_id}")
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(response_id)


def test_a_stream_a_poll_and_the_follower_that_all_see_the_end_meter_it_once(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(followed)
    with client.responses.retrieve(response_id, stream=True) as stream:
        events = iter(stream)
        first = next(events)
        assert (first.type, first.sequence_number, first.response.model) == ("response.created", 0, "native")
        asked = len(native.queries)
        polled = client.responses.retrieve(response_id, include=[ENCRYPTED])
        assert polled.status == "queued" and polled.model == "native"
        # a held one's include is passed on (the follower's asking carries no query)
        assert [parse_qs(query) for query in native.queries[asked:] if query] == [{"include[]": [ENCRYPTED]}]
        native.finish(response_id)
        assert client.responses.retrieve(response_id).status == "completed"  # a poll (or the follower) sees it end
        rest = list(events)
    assert rest[-1].type == "response.completed" and rest[-1].response.usage.total_tokens == USAGE["total_tokens"]
    assert [event.sequence_number for event in [first, *rest]] == list(range(len(rest) + 1))
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")


def test_a_stream_asked_with_another_true_spelling_is_asked_of_the_upstream_as_true(
        polled: Gateway, native: FakeResponsesUpstream) -> None:
    """``stream=1`` reads as true to the gateway, which then relays an event stream: the upstream is
    asked ``stream=true``, the value the gateway read, not a spelling it may read otherwise; the
    rest of the query goes as sent."""
    _, client, response_id = _started(polled)
    url = f"{client.base_url}responses/{response_id}?stream=1&starting_after=1"
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {client.api_key}"}) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        first = next(line for line in answer.iter_lines() if line.startswith("data:"))
    assert json.loads(first[5:])["sequence_number"] == 2
    assert parse_qs(native.queries[-1]) == {"stream": ["true"], "starting_after": ["1"]}
