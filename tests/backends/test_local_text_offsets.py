"""Text completions' logprobs on the local engine. ``text_offset``: each token's offset is where its
text starts in the returned text (a token holding part of a character at that character), the same
streamed as not, also while a stop string's prefix is held back and for an echoed prompt (a string
prompt echoed exactly as sent, special tokens' text and its room too; a token-id one decoded whole).
``top_logprobs``: as OpenAI and vLLM answer, each position's dict holds the ``logprobs`` most likely
tokens and always the token actually there (the sampled one, or the echoed prompt's), so it has
``logprobs`` or ``logprobs + 1`` entries; the same streamed as not."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from backends.local import LocalEngineBackend
from backends.openai_wire import CompletionLogprobs, CompletionRequest
from engine import AsyncEngine, EngineConfig
from engine.tiny_model import build_tiny_model

SUN = "\U0001f31e"  # four UTF-8 bytes: four tokens of the tiny byte-level tokenizer


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LocalEngineBackend:
    folder = build_tiny_model(tmp_path_factory.mktemp("offsets") / "tiny", seed=5, max_position_embeddings=512)
    engine = AsyncEngine(EngineConfig(model=str(folder), num_kv_blocks=64, block_size=16, max_model_len=128))
    return LocalEngineBackend(engine, str(folder))


def completion(**body: Any) -> CompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "tiny", "prompt": "The train", **body}), type=CompletionRequest)


async def _both(backend: LocalEngineBackend, **body: Any) -> tuple[str, CompletionLogprobs, str, list[int]]:
    """The non-streamed text and logprobs, and the streamed text and offsets, of one request."""
    choice = (await backend.complete(completion(**body))).response.choices[0]
    assert choice.logprobs is not None
    streamed = await backend.complete_stream(completion(**body, stream=True))
    chunks = [ch for c in [c async for c in streamed.chunks] for ch in c.choices]
    offsets = [o for ch in chunks if ch.logprobs for o in ch.logprobs.text_offset]
    return choice.text, choice.logprobs, "".join(ch.text for ch in chunks), offsets


def _assert_offsets_index(text: str, lp: CompletionLogprobs) -> None:
    """Offsets rise, stay in the text, and a whole token's text is found at its offset (a special
    token takes no room: its text was skipped)."""
    assert lp.text_offset == sorted(lp.text_offset)
    for token, offset in zip(lp.tokens, lp.text_offset):
        assert offset <= len(text)
        if "\ufffd" not in token and not token.startswith("<|") and offset < len(text):
            assert text[offset : offset + len(token)] == token


async def test_streamed_offsets_agree_while_a_stop_string_prefix_is_held_back(backend: LocalEngineBackend) -> None:
    body = dict(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    plain = (await backend.complete(completion(**body))).response.choices[0].text
    # every prefix of the answer could begin this stop string: the stream holds its text back to the end
    text, lp, streamed_text, offsets = await _both(backend, **body, stop=[plain + "\u2603"])
    assert text == streamed_text == plain
    _assert_offsets_index(text, lp)
    assert offsets == lp.text_offset


async def test_offsets_of_tokens_holding_part_of_a_character(backend: LocalEngineBackend) -> None:
    body = dict(max_tokens=12, temperature=0, logprobs=0, echo=True, prompt=f"sun {SUN} day",
                guided_regex=f"{SUN}{SUN} ok")
    text, lp, streamed_text, offsets = await _both(backend, **body)
    assert text == streamed_text == f"sun {SUN} day{SUN}{SUN} ok"
    _assert_offsets_index(text, lp)
    assert lp.text_offset[lp.tokens.index(" d")] == text.index(" day")  # after the prompt's sun
    assert offsets == lp.text_offset


def _assert_the_token_is_among_its_top(lp: CompletionLogprobs, k: int) -> int:
    """Every scored position lists its own token with its logprob; return how many were not in the
    top ``k`` (so the test knows it saw some)."""
    outside = 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        if value is None:
            assert top is None  # the prompt's first token: nothing predicts it
            continue
        assert top is not None and top.get(token) == pytest.approx(value), (token, value, top)
        assert k <= len(top) <= k + 1
        outside += len(top) == k + 1
    return outside


@pytest.mark.parametrize("k", [0, 1, 2])
async def test_top_logprobs_always_hold_the_sampled_and_echoed_tokens(backend: LocalEngineBackend, k: int) -> None:
    body = dict(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True, logprobs=k, echo=True)
    choice = (await backend.complete(completion(prompt="The train runs", **body))).response.choices[0]
    assert choice.logprobs is not None
    assert _assert_the_token_is_among_its_top(choice.logprobs, k) > 0  # sampling at t=1 left the top k
    streamed = await backend.complete_stream(completion(prompt="The train runs", **body, stream=True))
    parts = [ch.logprobs for c in [c async for c in streamed.chunks] for ch in c.choices if ch.logprobs]
    assert [t for p in parts for t in p.top_logprobs] == choice.logprobs.top_logprobs


TEMPLATED = f"<|start_header_id|>user<|end_header_id|>\n\nhi  \t é{SUN}<|eot_id|>"  # a raw chat template


def _assert_prompt_offsets_index(text: str, prompt: str, lp: CompletionLogprobs, added: int) -> None:
    """The echoed prompt's tokens: the ``added`` ones the tokenizer put first (a BOS, not in the
    text) at 0, taking no room; then each one's text, special or not, at its offset (a token holding
    part of a character at that character), one after another to the prompt's end."""
    assert lp.text_offset[:added] == [0] * added and lp.text_offset == sorted(lp.text_offset)
    ends = []
    for token, offset in zip(lp.tokens[added:], lp.text_offset[added:]):
        if offset >= len(prompt):
            break
        if "\ufffd" not in token:
            assert text[offset:offset + len(token)] == token, (token, offset, text)
            ends.append(offset + len(token))
    assert ends[-1] == len(prompt)


@pytest.mark.parametrize("prompt", ["A<|eot_id|>B  C", TEMPLATED, "<|begin_of_text|>x"])
@pytest.mark.parametrize("max_tokens", [0, 4])
async def test_a_string_prompt_is_echoed_exactly_as_sent(backend: LocalEngineBackend, prompt: str,
                                                         max_tokens: int) -> None:
    """Special tokens' text in a string prompt (a raw chat template, as scored) was dropped from the
    echo. As OpenAI and vLLM: the prompt as sent, streamed and not, with n > 1 and several prompts,
    and with logprobs its special tokens take their room (a BOS the tokenizer added takes none)."""
    body = dict(max_tokens=max_tokens, temperature=1.0, seed=2, ignore_eos=True, echo=True, n=2,
                prompt=[prompt, "The train"])
    for logprobs in (None, 1):
        done = (await backend.complete(completion(**body, logprobs=logprobs))).response.choices
        streamed = await backend.complete_stream(completion(**body, logprobs=logprobs, stream=True))
        texts: dict[int, str] = {}
        offsets: dict[int, list[int]] = {}
        for chunk in [c async for c in streamed.chunks]:
            for ch in chunk.choices:
                texts[ch.index] = texts.get(ch.index, "") + ch.text
                offsets.setdefault(ch.index, []).extend(ch.logprobs.text_offset if ch.logprobs else [])
        assert [c.index for c in done] == [0, 1, 2, 3]
        for c in done:
            sent = prompt if c.index < 2 else "The train"
            assert c.text.startswith(sent) and texts[c.index] == c.text, (c.index, c.text, texts[c.index])
            if logprobs is None:
                continue
            assert c.logprobs is not None and offsets[c.index] == c.logprobs.text_offset
            _assert_prompt_offsets_index(c.text, sent, c.logprobs, added=1)
            _assert_offsets_index(c.text, c.logprobs)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_token_id_prompt_is_echoed_with_every_token_text(backend: LocalEngineBackend, stream: bool) -> None:
    """As vLLM, which decodes a token-id prompt with its special tokens' text (there is no text
    sent to give back): every prompt token, the BOS too, takes its room in the echo."""
    ids = backend.tokenizer.encode("A<|eot_id|>B  C")
    body = dict(max_tokens=3, temperature=0, ignore_eos=True, echo=True, logprobs=0, prompt=ids)
    if stream:
        chunks = [ch for c in [c async for c in (await backend.complete_stream(completion(**body, stream=True))).chunks]
                  for ch in c.choices]
        text = "".join(ch.text for ch in chunks)
        lp = CompletionLogprobs(tokens=[t for ch in chunks if ch.logprobs for t in ch.logprobs.tokens],
                                text_offset=[o for ch in chunks if ch.logprobs for o in ch.logprobs.text_offset])
    else:
        choice = (await backend.complete(completion(**body))).response.choices[0]
        text, lp = choice.text, choice.logprobs
    assert text.startswith("<|begin_of_text|>A<|eot_id|>B  C")
    _assert_prompt_offsets_index(text, "<|begin_of_text|>A<|eot_id|>B  C", lp, added=0)
