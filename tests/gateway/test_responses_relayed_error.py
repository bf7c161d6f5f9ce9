"""An upstream's own ``error`` event in a relayed Responses stream reaches the client as the upstream
sent it, and the stream goes on as the upstream's does: its final event relayed, or, the upstream
ending there, the client's stream ended there too, with no ``response.failed`` the gateway made up;
the request settled as a failure, and a held background response left held (it may run on)."""

from __future__ import annotations

from typing import Any

import openai

from gateway.db import Database
from tests.gateway.tenancy_fixtures import db  # noqa: F401
from tests.gateway.test_responses_background_resume import polled  # noqa: F401
from tests.gateway.test_responses_background_stream import _spent_once
from tests.gateway.test_responses_background_usage import _metered, followed, native  # noqa: F401
from tests.gateway.test_responses_store import Gateway, gateway, responses_upstream  # noqa: F401
from tests.gateway.test_tenant_e2e import wait_for_rows
from tests.support.fake_responses import BROKEN_AFTER, ERROR_PART_WAY, ERROR_THEN_FAILED, FakeResponsesUpstream

RELAYED = {"type": "error", "code": "server_error", "message": "boom", "param": None,
           "sequence_number": BROKEN_AFTER}


def _streamed(client: openai.OpenAI, text: str, **extra: Any) -> list[Any]:
    with client.responses.create(model="native", input=text, stream=True, **extra) as stream:
        return list(stream)


def test_an_upstream_error_event_ending_the_stream_is_relayed_as_it_came(gateway: Gateway, db: Database) -> None:
    tenant, client = gateway.tenant()
    events = _streamed(client, ERROR_PART_WAY)
    assert [e.type for e in events][-2:] == ["response.output_item.added", "error"]  # no response.failed after it
    assert events[-1].model_dump() == RELAYED
    [row] = wait_for_rows(db, tenant, 1)
    assert (row.error_type, row.status) == ("upstream_error", 200)  # failed, as a stream failing part way is


def test_an_upstream_error_event_then_its_final_event_are_relayed_once(gateway: Gateway, db: Database) -> None:
    tenant, client = gateway.tenant()
    events = _streamed(client, ERROR_THEN_FAILED)
    assert [e.type for e in events][-3:] == ["response.output_item.added", "error", "response.failed"]
    assert events[-2].model_dump() == RELAYED
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message == "boom" and failed.model == "native"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [row] = wait_for_rows(db, tenant, 1)
    assert row.completion_tokens > 0  # metered from the final event's usage


def test_a_held_stream_ended_by_an_upstream_error_event_stays_held(
        polled: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client = polled.tenant()
    events = _streamed(client, ERROR_PART_WAY, background=True, max_output_tokens=2)
    assert events[-1].model_dump() == RELAYED and "response.failed" not in [e.type for e in events]
    response_id = events[0].response.id
    _metered(db, tenant, rows=1)  # its starting request's alone: the response is metered when it ends
    asked = len(native.reached)
    assert client.responses.retrieve(response_id).status == "in_progress"  # the upstream's word, not a failure
    assert len(native.reached) > asked
    native.finish(response_id)
    assert client.responses.retrieve(response_id).status == "completed"
    _spent_once(db, tenant, None)
