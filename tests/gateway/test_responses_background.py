"""Responses an upstream serving the Responses API runs in the background (``background: true``),
and its other answers not completed: owned by the tenant that asked, so ``GET`` and ``cancel`` reach
the upstream for that tenant only, and no other tenant can reach or continue them."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.tenancy_fixtures import db  # noqa: F401
from tests.gateway.test_responses_store import (  # noqa: F401  # the module's gateway and its upstreams
    Gateway,
    gateway,
    native,
    responses_upstream,
)
from tests.support.fake_responses import ECHO_FAILURE, FakeResponsesUpstream


def test_a_background_response_is_polled_through_the_gateway_until_done(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.tenant_client()
    queued = client.responses.create(model="native", input="work in the background", background=True)
    assert queued.status == "queued" and queued.model == "native"
    native.reached.clear()
    assert client.responses.retrieve(queued.id).status == "queued"
    assert native.reached == [("GET", f"/v1/responses/{queued.id}")]
    native.finish(queued.id)
    done = client.responses.retrieve(queued.id)
    assert done.status == "completed" and done.output_text == "work in the background" and done.model == "native"
    assert client.responses.retrieve(queued.id).status == "completed"  # kept: the upstream is not asked again
    assert len(native.reached) == 2
    client.responses.create(model="native", input="and then?", previous_response_id=queued.id)
    sent = native.received[-1]
    assert "previous_response_id" not in sent  # the kept conversation, with the background answer's output
    assert [item.get("role") for item in sent["input"] if item.get("type") == "message"] == [
        "user", "assistant", "user"]


def test_another_tenant_cannot_reach_a_background_response(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    alice, mallory = gateway.tenant_client(), gateway.tenant_client()
    secret = alice.responses.create(model="native", input="alice's background secret", background=True)
    native.finish(secret.id)
    native.reached.clear()
    sent_before = len(native.received)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.retrieve(secret.id)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.cancel(secret.id)
    with pytest.raises(openai.BadRequestError) as refused:
        mallory.responses.create(model="native", input="continue", previous_response_id=secret.id)
    assert refused.value.code == "previous_response_not_found"
    assert native.reached == [] and len(native.received) == sent_before  # never passed on
    assert alice.responses.retrieve(secret.id).output_text == "alice's background secret"


def test_a_background_response_is_cancelled_through_the_gateway(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.tenant_client()
    queued = client.responses.create(model="native", input="long job", background=True)
    native.reached.clear()
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.model == "native"
    assert native.reached == [("POST", f"/v1/responses/{queued.id}/cancel")]
    assert client.responses.retrieve(queued.id).status == "cancelled"  # kept as cancelled
    with pytest.raises(openai.BadRequestError) as again:
        client.responses.cancel(queued.id)
    assert again.value.param == "response_id"
    with pytest.raises(openai.BadRequestError) as continued:
        client.responses.create(model="native", input="go on", previous_response_id=queued.id)
    assert continued.value.param == "previous_response_id"
    assert len(native.reached) == 1


def test_continuing_an_unfinished_background_response_is_a_400(
        gateway: Gateway, native: FakeResponsesUpstream) -> None:
    client = gateway.tenant_client()
    queued = client.responses.create(model="native", input="not yet", background=True)
    sent_before = len(native.received)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="native", input="go on", previous_response_id=queued.id)
    assert refused.value.param == "previous_response_id" and "queued" in refused.value.message
    assert len(native.received) == sent_before
    native.finish(queued.id)  # finished meanwhile: asked of the upstream when continued
    client.responses.create(model="native", input="go on", previous_response_id=queued.id)
    assert len(native.received) == sent_before + 1


def test_a_failed_native_answer_is_owned(gateway: Gateway, native: FakeResponsesUpstream) -> None:
    alice, mallory = gateway.tenant_client(), gateway.tenant_client()
    failed = alice.responses.create(model="native", input=ECHO_FAILURE)
    assert failed.status == "failed"
    assert alice.responses.retrieve(failed.id).status == "failed"
    sent_before = len(native.received)
    with pytest.raises(openai.NotFoundError):
        mallory.responses.retrieve(failed.id)
    with pytest.raises(openai.BadRequestError):
        mallory.responses.create(model="native", input="continue", previous_response_id=failed.id)
    assert len(native.received) == sent_before


def test_background_on_a_translated_model_is_a_400_naming_it(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.tenant_client().responses.create(model="echo", input="hi", background=True)
    assert refused.value.param == "background"
