"""An answer the engine ends inside a multi-byte character (max_tokens, a stop token): the bytes of
that character's first tokens are a U+FFFD at the end of the text, as decoding the tokens gives
(and as the text shows such bytes anywhere else), not dropped; streamed and not, chat and
completions, with logprobs whose last offset is that U+FFFD's. And a token-id prompt that ends
inside a character: its continuation's text offsets are where the text shows each token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.local_gateway import Env, local_gateway

SUN = "\U0001f31e"  # four UTF-8 bytes: more than one token of the tiny byte-level tokenizer
FORCED = {"guided_regex": f"ab{SUN}"}
MESSAGES: list[Any] = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("cut")) as s:
        yield s


def _cut(env: Env) -> tuple[int, list[int]]:
    """How many tokens of the forced answer end inside the sun, and the answer's tokens."""
    whole = env.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True, extra_body=FORCED
    )
    assert whole.choices[0].message.content == f"ab{SUN}" and whole.choices[0].logprobs is not None
    tok = env.backend.tokenizer
    by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    ids = [by_bytes[bytes(t.bytes or [])] for t in whole.choices[0].logprobs.content or []]
    k = next(k for k in range(1, len(ids)) if env.backend.detokenize(ids[:k]).endswith("\ufffd"))
    return k, ids


@pytest.mark.parametrize("how", ["length", "stop_token"])
def test_completions_streamed_and_not(env: Env, how: str) -> None:
    k, ids = _cut(env)
    client = env.client()
    ends: dict[str, Any] = (
        {"max_tokens": k} if how == "length" else {"max_tokens": 12, "extra_body": {"stop_token_ids": [ids[k]]}}
    )
    body: dict[str, Any] = dict(model="tiny", prompt="Hello", temperature=0, logprobs=0, **ends)
    body["extra_body"] = {**FORCED, **body.get("extra_body", {})}
    done = client.completions.create(**body).choices[0]
    assert done.text == "ab\ufffd" and done.finish_reason == ("length" if how == "length" else "stop")
    assert done.logprobs is not None and done.logprobs.text_offset is not None
    assert done.logprobs.text_offset[-1] == 2  # the last token, part of the sun, is at its U+FFFD
    chunks = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.text
    streamed = [
        o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset or []
    ]
    assert streamed == done.logprobs.text_offset


@pytest.mark.parametrize("how", ["length", "stop_token"])
def test_chat_streamed_and_not(env: Env, how: str) -> None:
    k, ids = _cut(env)
    client = env.client()
    extra: dict[str, Any] = dict(FORCED) if how == "length" else {**FORCED, "stop_token_ids": [ids[k]]}
    body: dict[str, Any] = dict(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=k if how == "length" else 12, extra_body=extra
    )
    done = client.chat.completions.create(**body)
    assert done.choices[0].message.content == "ab\ufffd"
    assert done.usage is not None and done.usage.completion_tokens == k + (how == "stop_token")
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ab\ufffd"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == done.usage.completion_tokens


@pytest.mark.parametrize("echo", [False, True])
def test_offsets_when_the_prompt_ends_inside_a_character(env: Env, echo: bool) -> None:
    """A token-id prompt that ends inside the sun, continued by the token that completes it: that
    token's byte completes the prompt's character (its text is the prompt's), so it takes no room in
    the continuation; the next ones, the same byte again, are each a U+FFFD of their own. Each
    token's offset is where the text shows it, streamed and not (they were counted as if the prompt
    had not begun the character)."""
    tok = env.backend.tokenizer
    body, head = sun_cut_prompt(tok, "tiny", echo)
    client = env.client()
    done = client.completions.create(**body).choices[0]
    assert done.text == head + "\ufffd\ufffd" and done.logprobs is not None
    assert (done.logprobs.text_offset or [])[-3:] == [len(head), len(head), len(head) + 1]
    chunks = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.text
    streamed = [
        o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset or []
    ]
    assert streamed == done.logprobs.text_offset


def sun_cut_prompt(tok: Any, model: str, echo: bool) -> tuple[dict[str, Any], str]:
    """A completions request whose token-id prompt ends inside ``SUN``, its continuation biased to the
    token that completes it (three tokens, greedy, logprobs); and the echo that answer begins with."""
    ids = tok.encode(f"ab {SUN}", add_special_tokens=False)
    assert tok.decode(ids[:-1]).endswith("\ufffd")
    body: dict[str, Any] = dict(model=model, prompt=ids[:-1], max_tokens=3, temperature=0, logprobs=0, echo=echo,
                                logit_bias={str(ids[-1]): 100})
    return body, tok.decode(ids[:-1], skip_special_tokens=False) if echo else ""
