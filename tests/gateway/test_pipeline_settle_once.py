"""Every admitted request is settled exactly once, whatever fails between the backend's answer and
the response: an answer the dialect fails to encode with an unexpected exception (a bug, not a
typed ``BackendError``), or a stream whose relay cannot be set up. Each was a 500 that skipped
settlement: the concurrency slot stayed taken and no usage row was written (the stream's upstream
left open, too)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from backends.base import ChunkStream, Completed
from backends.config import DeploymentConfig
from backends.factory import build_backend
from gateway import pipeline
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from tests.conftest import gateway_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream

KEY = "sk-sy-settle-once"
CHAT: Any = [{"role": "user", "content": "hi"}]


class Unencodable:
    """Wraps a real backend: its whole answers carry a value no JSON encoder takes; its streams
    note when they are closed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.closed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat(self, request: Any, ctx: Any) -> Completed[Any]:
        result = await self.inner.chat(request, ctx)
        result.response.__dict__.clear()  # as an answer the gateway built: encoded from its fields
        result.response.choices[0].message.content = object()  # which the encoder refuses (TypeError)
        return result

    async def chat_stream(self, request: Any, ctx: Any) -> ChunkStream[Any]:
        result = await self.inner.chat_stream(request, ctx)
        close = result.aclose

        async def aclose() -> None:
            self.closed += 1
            await close()

        result.aclose = aclose
        return result


def _gateway(start_gateway: Any, upstream: FakeUpstream) -> tuple[openai.OpenAI, RecordingSink, ScriptedAdmission,
                                                                  list[Unencodable]]:
    settings = gateway_settings(upstream.url, models=[{
        "name": "echo", "max_retries": 0,
        "deployments": [{"provider": "openai", "model": "upstream-echo", "api_base": upstream.url}],
    }])
    backends: list[Unencodable] = []

    def factory(cfg: DeploymentConfig) -> Any:
        backends.append(Unencodable(build_backend(cfg)))
        return backends[-1]

    usage, admission = RecordingSink(), ScriptedAdmission()
    services = Services(authenticator=StaticKeys({KEY: Principal(key_id="k", tenant_id="t")}), admission=admission,
                        usage=usage, router=Router.from_settings(settings, factory))
    gw = start_gateway(settings, services)
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0), usage, admission, backends


def test_an_answer_the_dialect_fails_on_is_a_500_settled_once(start_gateway: Any, upstream: FakeUpstream) -> None:
    client, usage, admission, _ = _gateway(start_gateway, upstream)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="echo", messages=CHAT)
    rows = usage.wait_for(1)
    assert len(rows) == 1 and rows[0].status == 500 and rows[0].error_type == "internal_error"
    assert rows[0].prompt_tokens > 0  # the upstream did the work: charged what it reported
    assert len(admission.settled) == 1  # the concurrency slot is released
    assert admission.settled[0].actual_tokens == rows[0].prompt_tokens + rows[0].completion_tokens


def test_a_stream_whose_relay_fails_to_start_is_closed_and_settled_once(
    start_gateway: Any, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, usage, admission, backends = _gateway(start_gateway, upstream)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug setting up the relay")

    monkeypatch.setattr(pipeline, "SSERelay", broken)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="echo", messages=CHAT, stream=True)
    rows = usage.wait_for(1)
    assert len(rows) == 1 and rows[0].status == 500 and rows[0].error_type == "internal_error"
    assert len(admission.settled) == 1
    assert backends[0].closed == 1  # the upstream stream is not left open
