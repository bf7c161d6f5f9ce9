"""A backend that fails with an unexpected exception (a bug, not a typed BackendError): the client
gets a 500 in OpenAI's shape, the request is settled and metered, and the deployment's circuit
counts the failure and still lets its half-open trial through later."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from backends.base import UpstreamError
from backends.config import DeploymentConfig
from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from tests.conftest import gateway_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream, Fault

KEY = "sk-sy-pipeline-faults"
CHAT: Any = [{"role": "user", "content": "hi"}]


class Crashing:
    """Wraps a real backend; raises RuntimeError while ``crash`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.crash = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat(self, request: Any, ctx: Any) -> Any:
        if self.crash:
            raise RuntimeError("a bug in a backend")
        return await self.inner.chat(request, ctx)


def test_unexpected_backend_exception_is_a_500_and_the_circuit_recovers(start_gateway: Any, upstream: Any) -> None:
    settings = gateway_settings(upstream.url, models=[{
        "name": "echo", "max_retries": 0, "circuit": {"failures": 1, "window": 60, "cooldown": 0.3},
        "deployments": [{"provider": "openai", "model": "upstream-echo", "api_base": upstream.url}],
    }])
    crashing: list[Crashing] = []

    def factory(cfg: DeploymentConfig) -> Any:
        crashing.append(Crashing(build_backend(cfg)))
        return crashing[-1]

    usage, admission = RecordingSink(), ScriptedAdmission()
    services = Services(authenticator=StaticKeys({KEY: Principal(key_id="k", tenant_id="t")}), admission=admission,
                        usage=usage, router=Router.from_settings(settings, factory))
    gw = start_gateway(settings, services)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="echo", messages=CHAT)
    assert failed.value.body["type"] == "server_error"  # type: ignore[index]
    assert usage.wait_for(1)[0].status == 500 and len(admission.settled) == 1
    with pytest.raises(openai.APIStatusError) as refused:  # the circuit opened after one failure
        client.chat.completions.create(model="echo", messages=CHAT)
    assert refused.value.status_code == 503
    time.sleep(0.35)
    with pytest.raises(openai.InternalServerError):  # the half-open trial ran, and crashed again
        client.chat.completions.create(model="echo", messages=CHAT)
    crashing[0].crash = False
    time.sleep(0.35)
    reply = client.chat.completions.create(model="echo", messages=CHAT)  # a trial slot was free again
    assert reply.choices[0].message.content


class Poisoned:
    """Wraps a real backend; a chat whose last message says "poison" fails as the provider's 5xx."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat(self, request: Any, ctx: Any) -> Any:
        if "poison" in request.messages[-1].text():
            raise UpstreamError("the provider broke on this input", status=500)
        return await self.inner.chat(request, ctx)


def test_one_tenants_failing_requests_limit_that_tenant_alone(start_gateway: Any, upstream: FakeUpstream) -> None:
    settings = gateway_settings(upstream.url, models=[{
        "name": "echo", "max_retries": 0, "circuit": {"failures": 3, "window": 60, "cooldown": 60},
        "deployments": [{"provider": "openai", "model": "upstream-echo", "api_base": upstream.url}],
    }])
    keys = {"sk-flooder": Principal(key_id="kf", tenant_id="flooder"), "sk-other": Principal(key_id="ko",
                                                                                              tenant_id="other")}

    def poisoned(cfg: DeploymentConfig) -> Any:
        return Poisoned(build_backend(cfg))

    services = Services(authenticator=StaticKeys(keys), admission=ScriptedAdmission(), usage=RecordingSink(),
                        router=Router.from_settings(settings, poisoned))
    gw = start_gateway(settings, services)
    flooder, other = (openai.OpenAI(base_url=gw.url + "/v1", api_key=k, max_retries=0) for k in keys)
    upstream.fail_next(*[Fault(status=400)] * 5)  # the request's own fault: never counts against the deployment
    for _ in range(5):
        with pytest.raises(openai.BadRequestError):
            other.chat.completions.create(model="echo", messages=CHAT)
    assert other.chat.completions.create(model="echo", messages=CHAT).choices[0].message.content
    statuses = []
    for _ in range(6):
        try:
            flooder.chat.completions.create(model="echo", messages=[{"role": "user", "content": "poison"}])
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)
    assert statuses == [502, 502, 502, 503, 503, 503]  # its own circuit opened after three failures
    with pytest.raises(openai.APIStatusError) as refused:  # even for a harmless request, for the cooldown
        flooder.chat.completions.create(model="echo", messages=CHAT)
    assert refused.value.status_code == 503 and "this tenant" in refused.value.message
    for _ in range(3):  # everyone else is served by the same deployment
        assert other.chat.completions.create(model="echo", messages=CHAT).choices[0].message.content
