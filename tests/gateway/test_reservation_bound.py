"""Prompt reservations are an upper bound: the byte bound is never below what a byte-level BPE
tokenizer makes of the text (CJK and emoji included), with the chat template's tokens on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from tokenizers import Tokenizer

from backends.estimate import bound_chat_prompt, bound_text, estimate_chat_prompt
from backends.factory import build_backend
from backends.openai_wire import ChatCompletionRequest, ChatMessage
from backends.prompt_count import GIL_FREE_CHARS, PromptCounter
from engine.tiny_model import TOKENIZER_JSON
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import ConfigError
from tests.conftest import gateway_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_upstream import FakeUpstream
from tests.support.local_gateway import local_gateway

TEXTS = [
    "Hello, how are you today?",
    "请用中文详细解释一下量子计算的基本原理以及它和经典计算的区别。",
    "🙂🚀🎉👩‍👩‍👧‍👦 emoji ✨ mixed with text",
    "Ünïcödé naïve café — “quotes” and ½ fractions",
    "x" * 5000,
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_JSON))  # byte-level BPE trained on English only: CJK costs a token a byte


@pytest.mark.parametrize("text", TEXTS)
def test_byte_bound_is_never_below_the_token_count(tokenizer: Tokenizer, text: str) -> None:
    assert bound_text(text) >= len(tokenizer.encode(text, add_special_tokens=True).ids)


def test_chinese_prompt_reserved_above_its_cost_where_the_character_estimate_undercounts(tokenizer: Tokenizer) -> None:
    text = TEXTS[1]
    cost = len(tokenizer.encode(text).ids)
    request = ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content=text)])
    assert estimate_chat_prompt(request) < cost  # the issue: reserved at 1/4 of what it costs
    assert bound_chat_prompt(request) >= cost + 16  # the bound covers the text and a template's markers


def test_the_engine_reserves_the_prompt_at_its_own_tokenizer_count(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": TEXTS[1] + TEXTS[2]}]
    with local_gateway(tmp_path) as env:
        env.client().chat.completions.create(model="tiny", messages=messages, max_tokens=3)  # type: ignore[arg-type]
        request = msgspec.convert({"model": "tiny", "messages": messages}, ChatCompletionRequest)
        exact = len(env.backend.tokenize_chat(request))
        record = env.usage.wait_for(1)[0]
        env.wait_idle()
    assert env.admission.settled[0].ticket.reserved_tokens == exact + 3  # the template's tokens, exactly
    assert record.prompt_tokens == exact


def test_a_configured_tokenizer_counts_a_long_text_as_a_short_one_is_counted(tokenizer: Tokenizer) -> None:
    """Past ``GIL_FREE_CHARS`` the counter encodes with another call (one that lets other threads run)."""
    text = TEXTS[1] + TEXTS[3] * (GIL_FREE_CHARS // len(TEXTS[3]))
    assert len(text) > GIL_FREE_CHARS
    assert PromptCounter(tokenizer).count(text) == len(tokenizer.encode(text, add_special_tokens=False).ids)


def _tokenized_settings(upstream: FakeUpstream, tokenizer: str) -> Any:
    return gateway_settings(upstream.url, models=[{"name": "echo", "deployments": [
        {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url, "tokenizer": tokenizer}]}])


def test_an_http_deployment_with_a_configured_tokenizer_reserves_its_count(
    start_gateway: Any, upstream: FakeUpstream
) -> None:
    settings = _tokenized_settings(upstream, str(TOKENIZER_JSON))
    admission = ScriptedAdmission()
    services = Services(authenticator=StaticKeys({"sk-t": Principal(key_id="k", tenant_id="t")}), admission=admission,
                        usage=RecordingSink(), router=Router.from_settings(settings, build_backend))
    gw = start_gateway(settings, services)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-t", max_retries=0)
    messages = [{"role": "user", "content": "hello there, a plain English prompt of some length " * 8}]
    client.chat.completions.create(model="echo", messages=messages, max_tokens=7)  # type: ignore[arg-type]
    request = msgspec.convert({"model": "echo", "messages": messages}, ChatCompletionRequest)
    counted = PromptCounter.load(str(TOKENIZER_JSON)).count_chat(request)
    assert admission.settled[0].ticket.reserved_tokens == counted + 7
    assert counted < bound_chat_prompt(request)  # tighter than the byte bound for English


def test_a_tokenizer_that_cannot_be_loaded_is_a_config_error(upstream: FakeUpstream, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[0\]\.tokenizer"):
        Router.from_settings(_tokenized_settings(upstream, str(tmp_path / "missing")), build_backend)
