"""The plain ``transformers`` provider: greedy parity with ``generate``, streaming, batching, abort, errors."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import torch
import transformers

from backends.base import BadRequest, ContextTooLong, Tokenizing, Unavailable
from backends.embeddings_wire import EmbeddingRequest
from backends.factory import build_backend
from backends.openai_wire import ChatCompletionRequest, ChatMessage, CompletionRequest, StreamOptions, set_extra_params
from backends.transformers_generate import HFGenerateBackend
from backends.transformers_generate.jobs import Event, GenerateKey, Job, RowParams
from backends.transformers_generate.params import generate_key
from backends.transformers_generate.worker import GenerateWorker
from engine.tiny_model import EOT
from gateway.body import decode_body
from gateway.settings import ConfigError, DeploymentConfig
from tests.support.fallback_models import build_model

ARCHS = ["gpt2", "gpt_neox", "phi3", "bloom"]
PROMPTS = ["Hello world, the quick", "Paged attention keeps key and value blocks", "fox"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = build_model(arch, tmp_path_factory.mktemp(f"hf-{arch}"))
        return made[arch]

    return get


@pytest.fixture
async def backend_for(folder: Callable[[str], Path]):
    made: list[HFGenerateBackend] = []

    def make(arch: str, **options: object) -> HFGenerateBackend:
        backend = build_backend(DeploymentConfig(provider="transformers", model=str(folder(arch)), options=options))
        assert isinstance(backend, HFGenerateBackend)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


def reference(folder: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate on the same weights (stops at EOS, which it keeps)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def completion(prompt: str | list[str], **kw: object) -> CompletionRequest:
    return CompletionRequest(model="m", prompt=prompt, **{"max_tokens": 16, "temperature": 0.0, **kw})


def chat(text: str, **kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content=text)],
                                 **{"max_tokens": 16, "temperature": 0.0, **kw})


@pytest.mark.parametrize("arch", ARCHS)
async def test_greedy_completion_equals_transformers_generate(arch: str, folder, backend_for) -> None:
    backend = backend_for(arch)
    tok = backend.tokenizer
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        want = reference(folder(arch), ids, 16)
        result = await backend.complete(completion(prompt))
        assert result.response.choices[0].text == tok.decode(want, skip_special_tokens=True)
        assert result.meter.exact and result.meter.prompt_tokens == len(ids)
        assert result.meter.completion_tokens == len(want) == result.response.usage.completion_tokens


async def test_chat_uses_the_chat_template_and_streams_the_same_text(folder, backend_for) -> None:
    backend = backend_for("phi3")
    tok = backend.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], add_generation_prompt=True,
                                   tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    want = tok.decode(reference(folder("phi3"), ids, 12), skip_special_tokens=True)
    whole = await backend.chat(chat("Hello there", max_tokens=12))
    assert whole.response.choices[0].message.content == want
    assert whole.meter.prompt_tokens == len(ids)

    stream = await backend.chat_stream(chat("Hello there", max_tokens=12, stream=True,
                                            stream_options=StreamOptions(include_usage=True)))
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.response.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == whole.meter.completion_tokens
    assert stream.meter.completion_tokens == whole.meter.completion_tokens


async def test_rows_of_different_prompts_share_one_generate_and_match_alone(folder, backend_for) -> None:
    backend = backend_for("gpt_neox")
    alone = [(await backend.complete(completion(p))).response.choices[0].text for p in PROMPTS]
    batched = await backend.complete(completion(PROMPTS, n=2))
    assert backend.worker.largest_batch == 2 * len(PROMPTS)
    texts = [c.text for c in sorted(batched.response.choices, key=lambda c: c.index)]
    assert texts == [t for t in alone for _ in range(2)]
    both = await asyncio.gather(*(backend.complete(completion(p, stop=["zz"])) for p in PROMPTS))
    assert [r.response.choices[0].text for r in both] == alone


async def test_stop_strings_cut_the_text(backend_for) -> None:
    backend = backend_for("gpt2")
    full = (await backend.complete(completion(PROMPTS[0], max_tokens=12, ignore_eos=True))).response.choices[0].text
    stop = full[3:6]
    cut = (await backend.complete(completion(PROMPTS[0], max_tokens=12, stop=[stop]))).response.choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    held = (await backend.complete(completion(PROMPTS[0], max_tokens=12, stop=[stop], min_tokens=12,
                                              ignore_eos=True))).response.choices[0]
    assert held.text == full and held.finish_reason == "length"  # no stop string counts before min_tokens


@pytest.mark.parametrize("include", [True, False])
async def test_included_stop_string_stays_in_the_text(backend_for, include: bool) -> None:
    """vLLM's include_stop_str_in_output: cut right after the stop string instead of before it,
    streamed or not, for every choice; the same tokens either way."""
    backend = backend_for("gpt2")
    full = (await backend.complete(completion(PROMPTS[0], max_tokens=12, ignore_eos=True))).response.choices[0].text
    stop = full[3:6]
    want = full[: full.index(stop) + len(stop) * include]
    kw = dict(max_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=include, n=2)
    whole = await backend.complete(completion(PROMPTS[0], **kw))
    assert [(c.text, c.finish_reason) for c in whole.response.choices] == [(want, "stop")] * 2
    stream = await backend.complete_stream(completion(PROMPTS[0], **kw, stream=True))
    texts = ["", ""]
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [want] * 2 and stream.meter.completion_tokens == whole.meter.completion_tokens


async def test_seeded_sampling_repeats(backend_for) -> None:
    backend = backend_for("gpt2")
    req = completion(PROMPTS[1], temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    first = (await backend.complete(req)).response.choices[0].text
    assert (await backend.complete(req)).response.choices[0].text == first


def test_seed_minus_one_is_no_seed() -> None:
    """vLLM's ``seed: -1`` means unseeded: sampled afresh (and batched), never seeded with -1."""
    assert generate_key(completion(PROMPTS[0], temperature=1.0, seed=-1)).seed is None
    assert generate_key(completion(PROMPTS[0], temperature=1.0, seed=0)).seed == 0


async def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(backend_for) -> None:
    """As vLLM: with ``include_usage`` every chunk carries the usage so far; without it, none does."""
    backend = backend_for("gpt2")
    for include_usage in (True, False):
        options = StreamOptions(include_usage=include_usage, continuous_usage_stats=True)
        asked = dict(max_tokens=4, ignore_eos=True, stream=True, stream_options=options)
        streams = [await backend.chat_stream(chat("hi", **asked)),
                   await backend.complete_stream(completion(PROMPTS[0], **asked))]
        for stream in streams:
            usages = [c.usage async for c in stream.chunks]
            assert stream.meter.completion_tokens == 4
            if not include_usage:
                assert all(u is msgspec.UNSET for u in usages)
                continue
            counts = [u.completion_tokens for u in usages]
            assert counts == sorted(counts) and counts[-1] == 4


@pytest.mark.parametrize("body, param", [
    (b'"stream": true, "stream_options": {"include_usage": true, "bogus": 1}', "stream_options.bogus"),
    (b'"messages": [{"role": "user", "content": "hi", "foo": 1}]', "messages[0].foo"),
    (b'"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]',
     "messages[0].content[0].foo"),
    (b'"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "foo": 1}}',
     "response_format.json_schema.foo"),
])
async def test_unknown_nested_field_is_a_400_naming_its_path(backend_for, body: bytes, param: str) -> None:
    """A request as the gateway decodes it: a nested field the wire types do not model is refused."""
    backend = backend_for("gpt2")
    fields = b'{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], ' + body + b"}"
    request = decode_body(fields, ChatCompletionRequest)
    with pytest.raises(BadRequest) as caught:
        await (backend.chat_stream(request) if request.is_stream else backend.chat(request))
    assert caught.value.param == param
    text = decode_body(b'{"model": "m", "prompt": "hi", "stream_options": {"bogus": 1}}', CompletionRequest)
    with pytest.raises(BadRequest) as caught:
        await backend.complete(text)
    assert caught.value.param == "stream_options.bogus"


async def test_closing_a_stream_aborts_and_meters_what_was_produced(backend_for) -> None:
    backend = backend_for("gpt2")
    stream = await backend.complete_stream(completion(PROMPTS[0], max_tokens=200, ignore_eos=True, stream=True))
    got = 0
    async for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].text)
        if got == 3:
            break
    await stream.aclose()
    assert 3 <= stream.meter.completion_tokens < 200
    assert backend.stats().in_flight == 0 and backend.stats().queue_depth == 0
    after = await backend.complete(completion(PROMPTS[2], max_tokens=4, ignore_eos=True))
    assert after.meter.completion_tokens == 4


async def test_closing_a_stream_never_read_cancels_its_job(backend_for) -> None:
    backend = backend_for("gpt2")
    for start in (backend.chat_stream(chat("hello", max_tokens=200, stream=True)),
                  backend.complete_stream(completion(PROMPTS[0], max_tokens=200, ignore_eos=True, stream=True))):
        stream = await start
        assert backend.stats().in_flight == 1
        await stream.aclose()  # the client went away before the first chunk was asked for
        assert backend.stats().in_flight == 0 and backend.stats().queue_depth == 0
        assert stream.meter.completion_tokens < 200


async def test_stats_count_a_queued_request_in_flight_and_in_the_queue(backend_for) -> None:
    """``in_flight`` is every request accepted and not finished (queued ones too); ``queue_depth`` is
    the part of it still waiting for the worker (``BackendStats``)."""
    backend = backend_for("gpt2")
    running = await backend.complete_stream(completion(PROMPTS[0], max_tokens=200, ignore_eos=True, stream=True,
                                                       temperature=1.0, seed=1))  # a seeded job runs alone
    await anext(aiter(running))  # the worker has taken it: what comes next waits behind it
    queued = await backend.complete_stream(completion(PROMPTS[1], max_tokens=4, stream=True))
    stats = backend.stats()
    assert (stats.in_flight, stats.queue_depth) == (2, 1)
    await running.aclose()
    assert [c async for c in queued]  # served once the worker is free
    assert backend.stats().in_flight == 0 and backend.stats().queue_depth == 0


async def test_bad_requests_are_typed(backend_for) -> None:
    backend = backend_for("gpt2")
    with pytest.raises(BadRequest, match="top_logprobs requires"):
        await backend.chat(chat("hi", top_logprobs=2))
    with pytest.raises(ContextTooLong):
        await backend.complete(completion("hi", max_tokens=10_000))
    with pytest.raises(BadRequest, match="max_tokens"):
        await backend.complete(completion("hi", max_tokens=0))
    with pytest.raises(BadRequest, match="token ids"):
        await backend.complete(completion([[1, 99999]]))
    for key in ("x", "\u00b2", "\uff11", "1_0"):  # a superscript two passed isdigit() and then failed int(): a 500
        with pytest.raises(BadRequest, match="logit_bias"):
            await backend.complete(completion("hi", logit_bias={key: 1.0}))
    with pytest.raises(BadRequest, match="echo with logprobs") as no_scoring:
        await backend.complete(completion("hi", echo=True, logprobs=1))
    assert no_scoring.value.param == "echo"


async def test_output_limit_errors_name_the_field_sent(backend_for) -> None:
    backend = backend_for("phi3")
    for field in ("max_completion_tokens", "max_tokens"):
        with pytest.raises(BadRequest) as low:
            await backend.chat(chat("hi", **{field: 0}))
        assert low.value.param == field and field in low.value.message
        with pytest.raises(ContextTooLong) as too_long:
            await backend.chat(chat("hi", **{field: 100_000}))
        assert too_long.value.param == field and field in too_long.value.message
        assert field == "max_tokens" or "max_tokens" not in too_long.value.message
        with pytest.raises(BadRequest) as info:
            await backend.chat(chat("hi", **{field: 4, "min_tokens": 8}))
        assert info.value.param == "min_tokens" and info.value.message == f"min_tokens must be <= {field}"


async def test_logprobs_are_the_models_raw_distribution(folder, backend_for) -> None:
    backend = backend_for("gpt2")
    ids = backend.tokenizer.encode(PROMPTS[0])
    result = await backend.complete(completion(PROMPTS[0], max_tokens=6, ignore_eos=True, logprobs=3))
    out = result.response.choices[0].logprobs
    model = transformers.AutoModelForCausalLM.from_pretrained(folder("gpt2"))
    new = reference(folder("gpt2"), ids, 6)
    with torch.no_grad():
        dist = torch.log_softmax(model(torch.tensor([ids + new])).logits[0, len(ids) - 1 : -1].float(), dim=-1)
    want = [float(dist[i, t]) for i, t in enumerate(new)]
    assert out.token_logprobs == pytest.approx(want, abs=1e-4)
    # greedy: the sampled token is the most likely one; the alternatives are the top 3, keyed by text
    # (ids that decode alike, such as partial UTF-8 bytes, share a key)
    for i, top in enumerate(out.top_logprobs):
        best = dist[i].topk(3).values.tolist()
        assert out.token_logprobs[i] == pytest.approx(best[0], abs=1e-4)
        assert 1 <= len(top) <= 3 and all(min(abs(v - b) for b in best) < 1e-4 for v in top.values())
    assert "".join(out.tokens) == result.response.choices[0].text

    stream = await backend.chat_stream(chat("hi", max_tokens=5, ignore_eos=True, stream=True, logprobs=True,
                                            top_logprobs=2))
    streamed = [lp for c in [c async for c in stream] if c.choices and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content]
    whole = await backend.chat(chat("hi", max_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=2))
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob)
                                                        for t in whole.response.choices[0].logprobs.content]
    assert len(streamed) == 5 and all(len(t.top_logprobs) == 2 for t in streamed)


def test_unknown_option_is_a_config_error(folder) -> None:
    with pytest.raises(ConfigError, match="unknown options"):
        build_backend(DeploymentConfig(provider="transformers", model=str(folder("gpt2")), options={"bogus": 1}))


def test_full_queue_is_unavailable(folder) -> None:
    """The worker is held inside a step (the first job's event sink blocks), so jobs pile up."""
    path = folder("gpt2")
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.generation_config.eos_token_id = None
    tok = transformers.AutoTokenizer.from_pretrained(path)
    worker = GenerateWorker(model, tok, {1}, 0, max_batch_rows=1, max_queue=1)
    entered, release = threading.Event(), threading.Event()

    def blocking(ev: Event) -> None:
        entered.set()
        release.wait(10)

    def job(emit: Callable[[Event], None]) -> Job:
        return Job([tok.encode("hi")], 1, GenerateKey(), RowParams(max_new_tokens=3), emit)

    seen: list[Event] = []
    worker.submit(job(blocking))
    assert entered.wait(10)
    queued = job(seen.append)
    worker.submit(queued)
    with pytest.raises(Unavailable, match="queue is full"):
        worker.submit(job(seen.append))
    worker.cancel(queued)
    assert [e.finish for e in seen] == ["abort"]
    release.set()
    worker.close()


def test_queued_jobs_with_equal_generate_parameters_share_a_batch(folder) -> None:
    """While the worker is held, two greedy jobs and one sampling job queue up; the greedy pair
    then runs as one batch (different max_tokens and stop strings are per-row) and sampling alone."""
    path = folder("gpt2")
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.generation_config = transformers.GenerationConfig()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    worker = GenerateWorker(model, tok, set(), 0, max_batch_rows=4, max_queue=8)
    entered, release = threading.Event(), threading.Event()
    finished: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    done = threading.Semaphore(0)

    def sink(name: str) -> Callable[[Event], None]:
        def emit(ev: Event) -> None:
            if ev.finish is not None:
                finished[name].append(ev.finish)
                done.release()
        return emit

    def blocking(ev: Event) -> None:
        entered.set()
        release.wait(10)

    worker.submit(Job([tok.encode("hi")], 1, GenerateKey(), RowParams(max_new_tokens=2), blocking))
    assert entered.wait(10)
    worker.submit(Job([tok.encode("one two")], 1, GenerateKey(), RowParams(max_new_tokens=3), sink("a")))
    worker.submit(Job([tok.encode("three")], 1, GenerateKey(), RowParams(max_new_tokens=5, stop=["zz"]), sink("b")))
    worker.submit(Job([tok.encode("four")], 1, GenerateKey(do_sample=True), RowParams(max_new_tokens=2), sink("c")))
    release.set()
    for _ in range(3):
        assert done.acquire(timeout=30)
    assert finished == {"a": ["length"], "b": ["length"], "c": ["length"]}
    assert (worker.batches_run, worker.largest_batch) == (3, 2)
    worker.close()


def test_jobs_that_together_exceed_the_context_do_not_share_a_batch(folder) -> None:
    """A short prompt with a long output and a long prompt with a short one each fit the context,
    but in one batch the long prompt's row would run past the model's positions (GPT-2's are
    absolute, 256 here) and fail both: they run one after the other, each to its own length."""
    path = folder("gpt2")
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.generation_config = transformers.GenerationConfig()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    max_len = model.config.n_positions
    worker = GenerateWorker(model, tok, set(), 0, max_batch_rows=4, max_queue=8, max_len=max_len)
    entered, release = threading.Event(), threading.Event()
    events: dict[str, list[Event]] = {"short": [], "long": []}
    done = threading.Semaphore(0)

    def sink(name: str) -> Callable[[Event], None]:
        def emit(ev: Event) -> None:
            events[name].append(ev)
            if ev.finish is not None or ev.error is not None:
                done.release()
        return emit

    def blocking(ev: Event) -> None:
        entered.set()
        release.wait(10)

    short, long = tok.encode("hi"), list(range(10, max_len - 60))
    worker.submit(Job([short], 1, GenerateKey(), RowParams(max_new_tokens=2), blocking))
    assert entered.wait(10)
    worker.submit(Job([short], 1, GenerateKey(), RowParams(max_new_tokens=max_len - len(short)), sink("short")))
    worker.submit(Job([long], 1, GenerateKey(), RowParams(max_new_tokens=60), sink("long")))
    release.set()
    for _ in range(2):
        assert done.acquire(timeout=60)
    for name, limit in (("short", max_len - len(short)), ("long", 60)):
        assert [e.error for e in events[name] if e.error is not None] == []
        assert [e.finish for e in events[name] if e.finish is not None] == ["length"]
        assert sum(e.token for e in events[name]) == limit
    assert worker.batches_run == 3
    worker.close()


async def test_unsupported_parameters_are_400s_naming_them(backend_for) -> None:
    """Issue 19: never a silent drop; parameters that do not change the output are accepted."""
    backend = backend_for("gpt2")
    request = chat("hi", max_tokens=2)
    set_extra_params(request, {"reasoning_effort": msgspec.Raw(b'"low"')})
    with pytest.raises(BadRequest) as caught:
        await backend.chat(request)
    assert caught.value.param == "reasoning_effort"
    with pytest.raises(BadRequest) as caught:
        await backend.complete(completion("hi", stop_token_ids=[3]))
    assert caught.value.param == "stop_token_ids"
    fine = completion("hi", max_tokens=2)
    set_extra_params(fine, {"metadata": msgspec.Raw(b'{"a": "b"}'), "store": msgspec.Raw(b"true")})
    assert (await backend.complete(fine)).response.choices[0].finish_reason is not None


async def test_embeddings_and_tokenize_are_refused_whole(backend_for) -> None:
    """Plain generate serves neither ``/v1/embeddings`` nor ``/tokenize`` (it is not ``Tokenizing``):
    a request for them is a 400 on ``model``, so none of its fields is ignored."""
    backend = backend_for("gpt2")
    assert not isinstance(backend, Tokenizing)
    with pytest.raises(BadRequest) as caught:
        await backend.embed(decode_body(b'{"model": "m", "input": "hi", "bogus": 1}', EmbeddingRequest))
    assert caught.value.param == "model"


async def test_a_conversation_the_chat_template_refuses_is_a_400(tmp_path: Path) -> None:
    """A template that raises (as Gemma's and Mistral's do for a system message or roles out of turn)
    raises jinja's TemplateError, no ValueError: it was a 500."""
    path = build_model("gpt2", tmp_path / "strict")
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    refusal = "{%- if messages[0]['role'] == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    config["chat_template"] = refusal + config["chat_template"]
    config_path.write_text(json.dumps(config))
    backend = build_backend(DeploymentConfig(provider="transformers", model=str(path)))
    assert isinstance(backend, HFGenerateBackend)
    try:
        messages = [ChatMessage(role="system", content="Be brief"), ChatMessage(role="user", content="hi")]
        system = ChatCompletionRequest(model="m", max_tokens=4, messages=messages)
        with pytest.raises(BadRequest, match="System role not supported") as refused:
            await backend.chat(system)
        assert refused.value.param == "messages"
        assert (await backend.chat(chat("hi", max_tokens=2))).response.choices  # the template still serves others
    finally:
        await backend.aclose()


async def test_echo_gives_a_text_prompt_back_exactly_as_sent(backend_for) -> None:
    """Special tokens' text and whitespace included, as vLLM and OpenAI echo it (not decoded without them)."""
    backend = backend_for("gpt2")
    sent = f"A{EOT}B  C é"
    answer = (await backend.complete(completion(sent, echo=True, max_tokens=2, n=2))).response
    assert [c.text[:len(sent)] for c in answer.choices] == [sent, sent]
    stream = await backend.complete_stream(completion(sent, echo=True, max_tokens=2))
    first = [chunk async for chunk in stream][0]
    assert first.choices[0].text.startswith(sent)
