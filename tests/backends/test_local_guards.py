"""The local backend's guards: bad token ids are a 400 that spares the batch and the deployment's
circuit, a request the engine fails alone is a 500 that spares the circuit too, a grammar the
grammar engine gives up on is a 400 (never a "stop"), completions honour the gateway's output cap,
text offsets index the returned text, and 400s name the field the client sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest

from backends.base import BadRequest, ContextTooLong
from backends.call import CallContext
from backends.local import LocalEngineBackend
from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from engine import AsyncEngine, EngineConfig
from engine.sampler import SamplingRow
from engine.tiny_model import build_tiny_model
from tests.support.local_gateway import KEY, Env, local_gateway

MAX_LEN = 96
MESSAGES = [{"role": "user", "content": "Tell me about trains."}]
WIDE_LARK = "start: " + " | ".join(json.dumps(f"opt{i}") for i in range(2500))  # > 2000 items in a parser row
SPECIAL = 2  # the tiny tokenizer's <|start_header_id|>: special, not an end of sequence


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LocalEngineBackend:
    folder = build_tiny_model(tmp_path_factory.mktemp("guards") / "tiny", seed=5, max_position_embeddings=512)
    engine = AsyncEngine(EngineConfig(model=str(folder), num_kv_blocks=64, block_size=16, max_model_len=MAX_LEN))
    return LocalEngineBackend(engine, str(folder))


def chat(**body: Any) -> ChatCompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "tiny", "messages": MESSAGES, **body}), type=ChatCompletionRequest)


def completion(**body: Any) -> CompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "tiny", "prompt": "The train", **body}), type=CompletionRequest)


# -- token ids off the vocabulary ---------------------------------------------------------------

async def test_stop_token_ids_off_the_vocabulary_are_a_400_and_spare_the_batch(backend: LocalEngineBackend) -> None:
    good = asyncio.create_task(backend.chat(chat(max_tokens=16, temperature=0, ignore_eos=True)))
    await asyncio.sleep(0.05)
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat(max_tokens=4, min_tokens=2, stop_token_ids=[99999999]))
    assert info.value.param == "stop_token_ids"
    assert (await good).response.usage.completion_tokens == 16


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("guards-gw")) as served:
        yield served


def test_bad_stop_token_ids_never_open_the_circuit(env: Env) -> None:
    client = env.client()
    for _ in range(8):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                           extra_body={"min_tokens": 1, "stop_token_ids": [99999999]})
        assert info.value.body["param"] == "stop_token_ids"  # type: ignore[index]
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")
    env.wait_idle()


# -- a request the engine fails alone ------------------------------------------------------------

POISON_SEED = 666  # a request with this seed cannot be sampled


def _poison_sampling(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = env.backend.engine.engine.runner
    row = runner._row

    def poisoned(item: Any) -> SamplingRow:
        if item.seq.params.seed == POISON_SEED:
            raise IndexError("index 99999999 is out of bounds")
        return row(item)

    monkeypatch.setattr(runner, "_row", poisoned)


def _failed_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, seed=POISON_SEED,
                                            stream=True)
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    assert info.value.body["code"] == "request_failed"  # type: ignore[index]


def _circuit(env: Env) -> dict[str, Any]:
    rows = httpx.get(env.server.url + "/admin/v1/deployments", headers={"authorization": f"Bearer {KEY}"})
    return next(r for r in rows.json()["data"] if r["model"] == "tiny")


def test_a_request_the_engine_fails_is_a_500_that_never_opens_the_circuit(env: Env,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """More such failures than the circuit's limit (5): each a 500 server_error saying the engine
    failed the request, metered once, none counted against the deployment, which serves on."""
    _poison_sampling(env, monkeypatch)
    client = env.client()
    env.usage.records.clear()
    for _ in range(6):
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, seed=POISON_SEED)
        assert info.value.status_code == 500 and info.value.code == "request_failed"
        assert info.value.body["type"] == "server_error"  # type: ignore[index]
        assert "engine failed on this request" in info.value.message
    for _ in range(2):  # a stream fails after its first chunk (the role): an error event, then the end
        _failed_stream(client)
    circuit = _circuit(env)
    assert (circuit["state"], circuit["error_rate"], circuit["consecutive_failures"]) == ("healthy", 0.0, 0)
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")
    rows = env.usage.wait_for(9)
    assert [(r.status, r.error_type) for r in rows[:6]] == [(500, "request_failed")] * 6
    assert [(r.status, r.error_type, r.extra) for r in rows[6:8]] == [(200, "request_failed",
                                                                      {"outcome": "failed"})] * 2
    assert (rows[8].status, rows[8].error_type, len(rows)) == (200, None, 9)
    env.wait_idle()


# -- a grammar the grammar engine gives up on -----------------------------------------------------

async def test_a_grammar_that_errs_mid_answer_is_a_400_naming_the_field(backend: LocalEngineBackend) -> None:
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat(max_tokens=8, temperature=0, guided_grammar=WIDE_LARK))
    assert info.value.param == "guided_grammar" and "grammar engine failed" in info.value.message
    stream = await backend.chat_stream(chat(max_tokens=8, temperature=0, guided_grammar=WIDE_LARK, stream=True))
    finishes = []
    with pytest.raises(BadRequest) as info:
        async for chunk in stream.chunks:
            finishes += [c.finish_reason for c in chunk.choices if c.finish_reason]
    assert info.value.param == "guided_grammar" and not finishes


async def test_guided_choice_with_thousands_of_options(backend: LocalEngineBackend) -> None:
    choices = [f"opt{i}" for i in range(2500)]
    done = await backend.chat(chat(max_tokens=12, temperature=0, guided_choice=choices))
    answer = done.response.choices[0]
    assert answer.finish_reason == "stop" and answer.message.content in choices


async def test_a_huge_temperature_keeps_to_the_grammar_and_the_bans(backend: LocalEngineBackend) -> None:
    """A temperature past float32's range drew masked tokens: a grammar the answer broke was a 400
    blaming guided_choice, and a token logit_bias banned came out."""
    done = await backend.complete(completion(max_tokens=8, temperature=1e300, guided_choice=["yes", "no"]))
    assert done.response.choices[0].text in ("yes", "no")
    allowed = {"7": 0, "9": 0}
    banned = {str(t): -100 for t in range(1024) if str(t) not in allowed}
    done = await backend.complete(completion(max_tokens=8, temperature=1e300, logit_bias=banned, logprobs=0))
    logprobs = done.response.choices[0].logprobs
    assert logprobs is not None
    assert set(logprobs.tokens) <= {backend.logprobs.token(7), backend.logprobs.token(9)}



@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_a_repetition_penalty_past_float32_range_answers_as_its_nearest_in_range(
        backend: LocalEngineBackend, temperature: float) -> None:
    """A repetition_penalty of 1e-300 was 0 in the sampler (1e300 inf): seen logits became inf and
    NaN, and the answer garbage. Exactly, 1e-300 lifts the best seen token above all as 1e-30 does,
    and 1e300 sinks seen tokens as 1e30 does: the same answers."""
    body = dict(max_tokens=12, temperature=temperature, seed=4, ignore_eos=True, logprobs=0)
    for extreme, near in ((1e-300, 1e-30), (1e300, 1e30)):
        got = (await backend.complete(completion(repetition_penalty=extreme, **body))).response.choices[0]
        want = (await backend.complete(completion(repetition_penalty=near, **body))).response.choices[0]
        assert got.logprobs is not None and want.logprobs is not None
        assert got.logprobs.tokens == want.logprobs.tokens and got.text == want.text, (extreme, got, want)

# -- completions: the gateway's cap, text offsets -------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_completions_without_max_tokens_stop_at_the_gateway_cap(backend: LocalEngineBackend,
                                                                       stream: bool) -> None:
    capped = CallContext(output_cap=3)
    request = completion(temperature=0, ignore_eos=True, stream=stream)
    if stream:
        s = await backend.complete_stream(request, capped)
        chunks = [c async for c in s.chunks]
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert s.meter.completion_tokens == 3
    else:
        done = await backend.complete(request, capped)
        assert done.response.usage.completion_tokens == 3
    asked = await backend.complete(completion(temperature=0, ignore_eos=True, max_tokens=5), capped)
    assert asked.response.usage.completion_tokens == 5  # a limit the client set wins
    uncapped = await backend.complete(completion(temperature=0, ignore_eos=True))
    assert uncapped.response.usage.completion_tokens > 3  # no gateway: up to the context


@pytest.mark.parametrize("skip", [True, False])
async def test_completion_text_offsets_index_the_returned_text(backend: LocalEngineBackend, skip: bool) -> None:
    tokenizer = backend.tokenizer
    body = dict(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True, logprobs=0,
                logit_bias={str(SPECIAL): 6}, skip_special_tokens=skip)
    choice = (await backend.complete(completion(**body))).response.choices[0]
    lp = choice.logprobs
    assert lp is not None
    special = tokenizer.decode([SPECIAL], skip_special_tokens=False)
    assert special in lp.tokens and any(t != special for t in lp.tokens)  # special tokens among ordinary ones
    pieces = ["" if skip and t == special else t for t in lp.tokens]  # each token's part of the text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for piece, offset in zip(pieces, lp.text_offset):
        assert offset <= len(choice.text)
        if "\ufffd" not in piece:  # part of a character: its text comes with the token that completes it
            assert choice.text[offset : offset + len(piece)] == piece
    streamed = await backend.complete_stream(completion(**body, stream=True))
    offsets = [o for c in [c async for c in streamed.chunks] for ch in c.choices if ch.logprobs
               for o in ch.logprobs.text_offset]
    assert offsets == lp.text_offset


# -- 400s name the field the client sent -----------------------------------------------------------

async def test_output_limit_errors_name_the_field_sent(backend: LocalEngineBackend) -> None:
    for field in ("max_completion_tokens", "max_tokens"):
        with pytest.raises(BadRequest) as info:
            await backend.chat(chat(**{field: 0}))
        assert info.value.param == field and field in info.value.message
        with pytest.raises(ContextTooLong) as too_long:
            await backend.chat(chat(**{field: MAX_LEN}))
        assert too_long.value.param == field and f"plus {field} ({MAX_LEN})" in too_long.value.message
        assert field == "max_tokens" or "max_tokens" not in too_long.value.message
        with pytest.raises(BadRequest) as info:
            await backend.chat(chat(**{field: 4, "min_tokens": 8}))
        assert info.value.param == "min_tokens" and info.value.message == f"min_tokens must be <= {field}"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "bad"}}])
async def test_an_uncompilable_tool_schema_is_named(backend: LocalEngineBackend, choice: Any) -> None:
    tools = [{"type": "function", "function": {"name": "good", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "bad", "parameters": {
                 "type": "object", "properties": {"a": {"type": "nonsense"}}}}}]
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat(max_tokens=8, tools=tools, tool_choice=choice))
    assert info.value.param == "tools[1].function.parameters" and "nonsense" in info.value.message
