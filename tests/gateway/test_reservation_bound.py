"""Prompt reservations are an upper bound: the byte bound is never below what a byte-level BPE
tokenizer makes of the text (CJK and emoji included), with the chat template's tokens on top."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from tokenizers import Tokenizer

from backends.estimate import bound_chat_prompt, bound_text, estimate_chat_prompt
from backends.openai_wire import ChatCompletionRequest, ChatMessage
from engine.tiny_model import TOKENIZER_JSON
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
