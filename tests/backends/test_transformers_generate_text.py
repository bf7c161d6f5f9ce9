"""The plain ``transformers`` provider's text at a character split over tokens, through the gateway
with the openai SDK: a continuation of a prompt that ends inside a character has each token's text
offset where its text is (the bytes that end the prompt's character take no room), and an answer
cut inside a character ends in U+FFFD, streamed and not, as on the engine."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine.tokenizer import Tokenizer
from tests.backends.conftest import admin_gateway
from tests.backends.test_local_cut_character import SUN, sun_cut_prompt
from tests.conftest import ADMIN_KEY
from tests.support.fallback_models import build_model


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, Tokenizer]]:
    folder = build_model("gpt2", tmp_path_factory.mktemp("hf-gpt2"))
    deployment = {"provider": "transformers", "model": str(folder)}
    with admin_gateway([{"name": "m", "max_retries": 0, "deployments": [deployment]}]) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0), Tokenizer(folder)


@pytest.mark.parametrize("echo", [False, True])
def test_offsets_when_the_prompt_ends_inside_a_character(served: tuple[openai.OpenAI, Tokenizer], echo: bool) -> None:
    client, tok = served
    body, head = sun_cut_prompt(tok, "m", echo)
    body["extra_body"] = {"ignore_eos": True}
    if echo:  # plain generate cannot score the prompt: the echo goes without logprobs
        body.pop("logprobs")
    done = client.completions.create(**body).choices[0]
    assert done.text == head + "\ufffd\ufffd"  # the first token ends the prompt's sun; the others stand alone
    streamed = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == done.text
    if not echo:
        assert done.logprobs is not None and done.logprobs.text_offset == [0, 0, 1]
        offsets = [
            o for c in streamed if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset or []
        ]
        assert offsets == [0, 0, 1]


def test_logprob_bytes_of_a_token_holding_part_of_a_character(served: tuple[openai.OpenAI, Tokenizer]) -> None:
    """Each token's own bytes, as the engine gives them (they were the UTF-8 of a U+FFFD)."""
    client, tok = served
    part = tok.encode(SUN, add_special_tokens=False)[0]
    answer = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        temperature=0,
        logprobs=True,
        logit_bias={str(part): 100},
    )
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
    assert content and [bytes(t.bytes or []) for t in content] == [tok.token_bytes(part)] * 2
    assert tok.token_bytes(part) != "\ufffd".encode()
