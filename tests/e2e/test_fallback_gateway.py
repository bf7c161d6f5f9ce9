"""Both transformers fallback paths behind the gateway, driven by the official openai SDK.

- ``neox``: provider ``transformers`` (plain generate in a worker thread), GPT-NeoX.
- ``gpt2``: provider ``local`` with model_impl auto -> HF GPT-2 modules inside our engine.
- ``bloom``: provider ``local`` with model_impl auto -> Bloom cannot take our attention, so the
  deployment is served by plain generate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import torch
import transformers

from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import ConfigError, DeploymentConfig
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fallback_models import build_model
from tests.support.servers import ServerThread


@dataclass
class Env:
    url: str
    usage: RecordingSink
    folders: dict[str, Path]
    router: Router


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from gateway.app import create_app

    folders = {
        arch: build_model(arch, tmp_path_factory.mktemp(f"e2e-{arch}")) for arch in ("gpt_neox", "gpt2", "bloom")
    }
    plain = {"max_retries": 0}
    settings = gateway_settings(
        "http://127.0.0.1:9/v1",
        models=[
            {"name": "neox", "deployments": [{"provider": "transformers", "model": str(folders["gpt_neox"])}], **plain},
            {
                "name": "gpt2",
                "deployments": [
                    {
                        "provider": "local",
                        "model": str(folders["gpt2"]),
                        "options": {"num_kv_blocks": 64, "max_model_len": 128},
                    }
                ],
                **plain,
            },
            {
                "name": "bloom",
                "deployments": [
                    {
                        "provider": "local",
                        "model": str(folders["bloom"]),
                        "options": {"model_impl": "auto", "max_num_seqs": 4},
                    }
                ],
                **plain,
            },
        ],
    )
    usage = RecordingSink()
    keys = StaticKeys({ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True)})
    router = Router.from_settings(settings, build_backend)
    services = Services(authenticator=keys, admission=ScriptedAdmission(), usage=usage, router=router)
    with ServerThread(create_app(settings, services)) as server:
        yield Env(server.url + "/v1", usage, folders, router)


@pytest.fixture
def client(env: Env) -> openai.OpenAI:
    env.usage.records.clear()
    return openai.OpenAI(base_url=env.url, api_key=ADMIN_KEY, max_retries=0)


def greedy_text(folder: Path, prompt: str, max_new_tokens: int) -> tuple[str, int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([tok.encode(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    return tok.decode(new, skip_special_tokens=True), len(new)


@pytest.mark.parametrize("model, arch", [("neox", "gpt_neox"), ("gpt2", "gpt2"), ("bloom", "bloom")])
def test_completion_equals_generate_on_both_paths(client: openai.OpenAI, env: Env, model: str, arch: str) -> None:
    want, count = greedy_text(env.folders[arch], "Hello world, the quick", 12)
    reply = client.completions.create(model=model, prompt="Hello world, the quick", max_tokens=12, temperature=0)
    assert reply.choices[0].text == want
    assert reply.usage is not None and reply.usage.completion_tokens == count
    record = env.usage.wait_for(1)[0]
    assert (record.model, record.completion_tokens, record.exact) == (model, count, True)


@pytest.mark.parametrize("model", ["neox", "gpt2", "bloom"])
def test_chat_stream_with_usage(client: openai.OpenAI, env: Env, model: str) -> None:
    messages = [{"role": "user", "content": "Tell me about paged attention"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    env.usage.wait_for(1)
    env.usage.records.clear()
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    record = env.usage.wait_for(1)[0]
    assert record.exact and record.completion_tokens == whole.usage.completion_tokens


def test_models_list_shows_how_each_model_runs(client: openai.OpenAI) -> None:
    cards = {m.id: m for m in client.models.list()}
    assert cards["neox"].model_extra["metadata"]["model_impl"] == "generate"
    assert cards["gpt2"].model_extra["metadata"]["model_impl"] == "transformers"
    assert cards["bloom"].model_extra["metadata"]["model_impl"] == "generate"


def test_plain_generate_answers_a_named_tool_call_through_the_sdk(client: openai.OpenAI) -> None:
    params = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = client.chat.completions.create(model="neox", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                                       tool_choice={"type": "function", "function": {"name": "f"}})
    call = (r.choices[0].message.tool_calls or [])[0]
    assert r.choices[0].finish_reason == "stop" and call.function.name == "f"  # type: ignore[union-attr]
    assert 0 <= json.loads(call.function.arguments)["n"] <= 9  # type: ignore[union-attr]


def test_native_on_an_unsupported_architecture_fails_the_deployment_clearly(env: Env) -> None:
    config = DeploymentConfig(provider="local", model=str(env.folders["gpt2"]), options={"model_impl": "native"})
    with pytest.raises(ConfigError, match="GPT2LMHeadModel has no native implementation; natively supported: "):
        build_backend(config)


def test_bad_input_is_an_openai_error(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for model in ("neox", "gpt2"):  # plain generate and the engine: tools work, a bad choice is a 400
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], tools=tools,
                                           tool_choice={"type": "function", "function": {"name": "g"}})
        assert err.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="neox", messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}})
    assert err.value.param == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="neox", prompt="hi", extra_body={"guided_regex": "("})
    assert err.value.param == "guided_regex"
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="neox", prompt="hi", max_tokens=100_000)


@pytest.mark.parametrize("model", ["neox", "gpt2"])
def test_logprobs_on_both_paths(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 4 and all(t.logprob <= 0 and len(t.top_logprobs) >= 1 for t in content)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)  # greedy takes the top one


def test_client_gone_mid_stream_aborts_generation_and_meters_it(client: openai.OpenAI, env: Env) -> None:
    stream = client.completions.create(
        model="neox", prompt="Hello", max_tokens=200, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    texts = 0
    for chunk in stream:
        texts += bool(chunk.choices and chunk.choices[0].text)
        if texts == 3:
            break
    stream.close()
    record = env.usage.wait_for(1)[0]
    assert 3 <= record.completion_tokens < 200 and record.exact
    backend = env.router.resolve("neox").deployments[0].backend
    assert backend.stats().in_flight == 0 and backend.stats().queue_depth == 0
