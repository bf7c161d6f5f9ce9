"""The openai_http backend against a real loopback upstream: relaying, metering, typed errors."""

from __future__ import annotations

import calendar
import email.utils
import gzip
import time
import zlib
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from backends.base import (
    AuthFailed,
    BadRequest,
    Conflict,
    ContextTooLong,
    RateLimited,
    RequestFailed,
    Timeout,
    Unavailable,
    UpstreamError,
)
from backends.call import CallContext
from backends.embeddings_wire import EmbeddingRequest
from backends.http_upstream import ErrorDetail, event_error, status_error
from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    StreamOptions,
    encode_answer,
    set_relayed,
)
from backends.raw_http import MAX_DECODED
from backends.upstream_limits import limits_left
from gateway.settings import DeploymentConfig, Timeouts
from tests.support.fake_upstream import FakeUpstream, Fault


def backend_for(url: str, **timeouts: float) -> OpenAIHTTPBackend:
    t = Timeouts(**({"connect": 2, "first_byte": 5, "total": 10} | timeouts))
    return OpenAIHTTPBackend(DeploymentConfig(provider="openai", model="up-model", api_base=url, api_key="sk-x",
                                              timeouts=t))


def chat(text: str = "one two three", **kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="public", messages=[ChatMessage(role="user", content=text)], **kw)


@pytest.fixture
async def backend(upstream: FakeUpstream):
    b = backend_for(upstream.url)
    yield b
    await b.aclose()


async def test_unary_chat_sends_upstream_model_and_meters_exactly(backend: OpenAIHTTPBackend,
                                                                   upstream: FakeUpstream) -> None:
    done = await backend.chat(chat(temperature=0.3))
    assert done.response.choices[0].message.content == "one two three"
    assert done.meter.exact and done.meter.completion_tokens == 3
    assert upstream.last.json == {"model": "up-model", "messages": [{"role": "user", "content": "one two three"}],
                                  "temperature": 0.3}
    assert upstream.last.headers["authorization"] == "Bearer sk-x"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_built_completion_without_a_limit_gets_the_output_cap(backend: OpenAIHTTPBackend,
                                                                     upstream: FakeUpstream, stream: bool) -> None:
    """A completion the gateway built (no client bytes) is encoded with the cap as ``max_tokens``."""
    request = CompletionRequest(model="public", prompt="four words right here", stream=stream)
    if stream:
        chunks = (await backend.complete_stream(request, CallContext(output_cap=2))).chunks
        text = "".join([c.choices[0].text async for c in chunks if c.choices])
    else:
        text = (await backend.complete(request, CallContext(output_cap=2))).response.choices[0].text
    assert upstream.last.json["max_tokens"] == 2 and text == "four words "


async def test_unary_without_upstream_usage_is_estimated(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    upstream.options.report_usage = False
    done = await backend.complete(CompletionRequest(model="public", prompt="four words right here"))
    assert not done.meter.exact
    assert done.meter.prompt_tokens > 0 and done.meter.completion_tokens >= 4


async def test_stream_relays_without_buffering(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=2))  # the upstream never finishes this response
    stream = await backend.chat_stream(chat("a b c", stream=True))
    chunks = [await anext(stream.chunks), await anext(stream.chunks)]
    assert [c.choices[0].delta.content for c in chunks] == ["a ", "b "]
    assert backend.stats().in_flight == 1
    await stream.aclose()  # closing the ChunkStream closes the upstream response
    record = upstream.streams[-1]
    assert record.wait(10) and record.completed is False
    assert backend.stats().in_flight == 0
    assert stream.meter.completion_tokens == 2 and not stream.meter.exact


async def test_stream_closed_before_iteration_still_closes_upstream(backend: OpenAIHTTPBackend,
                                                                     upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(hang_after_chunks=1))
    stream = await backend.chat_stream(chat(stream=True))
    await stream.aclose()
    assert upstream.streams[-1].wait(10) and upstream.streams[-1].completed is False
    assert backend.stats().in_flight == 0


async def test_stream_asks_for_usage_and_strips_it_when_not_wanted(backend: OpenAIHTTPBackend,
                                                                    upstream: FakeUpstream) -> None:
    stream = await backend.chat_stream(chat(stream=True))
    chunks = [c async for c in stream]
    assert upstream.last.json["stream_options"] == {"include_usage": True} and upstream.last.json["stream"] is True
    assert all(c.choices for c in chunks)  # the usage-only chunk is dropped
    assert all("usage" not in msgspec.json.decode(msgspec.json.encode(c)) for c in chunks)  # and usage: null too
    assert stream.meter.exact and stream.meter.completion_tokens == 3


async def test_stream_with_usage_keeps_it(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    stream = await backend.complete_stream(CompletionRequest(model="p", prompt="x y", stream=True,
                                                             stream_options=StreamOptions(include_usage=True)))
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    assert stream.meter.exact


async def test_stream_usage_estimated_when_upstream_reports_none(backend: OpenAIHTTPBackend,
                                                                 upstream: FakeUpstream) -> None:
    upstream.options.report_usage = False
    stream = await backend.chat_stream(chat("p q r", stream=True, stream_options=StreamOptions(include_usage=True)))
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == stream.meter.completion_tokens >= 3
    assert not stream.meter.exact


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        (Fault(status=429, headers={"retry-after": "4"}), RateLimited, 429),
        (Fault(status=500), Unavailable, 500),
        (Fault(status=502), Unavailable, 502),
        # an engine node (switchyard engine serve) failed this one request: not the node's failure
        (Fault(status=500, body={"error": {"message": "sampling failed", "code": "request_failed"}}),
         RequestFailed, 500),
        (Fault(status=401), AuthFailed, 401),
        (Fault(status=403), AuthFailed, 403),
        (Fault(status=400), BadRequest, 400),
        (Fault(status=400, body={"error": {"message": "maximum context length is 10 tokens"}}), ContextTooLong, 400),
        (Fault(status=404), UpstreamError, 404),
        (Fault(status=200, body=b"<html>"), UpstreamError, None),
    ],
)
async def test_upstream_status_becomes_typed_error(backend: OpenAIHTTPBackend, upstream: FakeUpstream, fault: Fault,
                                                   error: type, status: int | None) -> None:
    for streaming in (False, True):
        upstream.fail_next(fault)
        with pytest.raises(error) as info:
            if streaming:
                await backend.chat_stream(chat(stream=True))
            else:
                await backend.chat(chat())
        assert type(info.value) is error and info.value.status == status
    assert backend.stats().in_flight == 0


async def test_rate_limit_retry_after(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=429, headers={"retry-after": "4"}))
    with pytest.raises(RateLimited) as info:
        await backend.chat(chat())
    assert info.value.retry_after == 4.0 and info.value.retryable


async def test_a_2xx_error_object_fails_as_the_error_it_names(backend: OpenAIHTTPBackend,
                                                              upstream: FakeUpstream) -> None:
    """An upstream that answers 200 with an error object instead of an answer fails as that error
    (here retryable), not as an invalid answer."""
    upstream.fail_next(Fault(status=200, body={"error": {"message": "model overloaded", "type": "server_error",
                                                         "code": 503}}))
    with pytest.raises(Unavailable) as info:
        await backend.chat(chat())
    assert info.value.message == "model overloaded" and info.value.retryable
    upstream.fail_next(Fault(status=200, body={"error": {"message": "model overloaded", "type": "server_error",
                                                         "code": 503}}))
    with pytest.raises(Unavailable) as info:  # the same answer to a stream request
        await backend.chat_stream(chat(stream=True))
    assert info.value.message == "model overloaded" and info.value.retryable


async def test_an_error_object_at_the_top_level_gives_its_message(backend: OpenAIHTTPBackend,
                                                                 upstream: FakeUpstream) -> None:
    """vLLM's and SGLang's error answers are the error object itself, not one under ``error``."""
    upstream.fail_next(Fault(status=400, body={"object": "error", "message": "temperature must be non-negative",
                                               "type": "BadRequestError", "param": "temperature", "code": 400}))
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat())
    assert info.value.message == "temperature must be non-negative" and info.value.param == "temperature"
    assert status_error(422, {}, b'{"status": "nope"}').message == '{"status": "nope"}'  # no message: as text
    assert status_error(422, {}, b'{"detail": "Not Found"}').message == "Not Found"  # FastAPI's


async def test_a_top_level_error_object_on_a_2xx_fails_as_the_error_it_says(backend: OpenAIHTTPBackend,
                                                                            upstream: FakeUpstream) -> None:
    """vLLM's error object answered with 200 is that error (its code's status, message and type),
    whole or instead of a stream, not an answer missing its ``id``."""
    vllm = {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError", "param": None,
            "code": 400}
    upstream.fail_next(Fault(status=200, body=vllm))
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat())
    assert (info.value.message, info.value.status) == ("max_tokens is too large", 400)
    upstream.fail_next(Fault(status=200, body=vllm | {"code": 503, "message": "engine dead"}))
    with pytest.raises(Unavailable, match="engine dead"):
        await backend.chat_stream(chat(stream=True))
    upstream.fail_next(Fault(status=200, body=vllm | {"code": None, "type": "weird", "message": "odd"}))
    with pytest.raises(UpstreamError, match="odd"):
        await backend.chat(chat())


async def test_a_compressed_answer_that_inflates_past_the_limit_fails_clearly(backend: OpenAIHTTPBackend,
                                                                             upstream: FakeUpstream) -> None:
    """A small gzip or deflate body that would inflate to more than ``MAX_DECODED`` bytes is not
    inflated whole in memory: it fails as an answer the gateway cannot use (502), saying why."""
    zeros = b"0" * (MAX_DECODED + 1)
    for encoding, packed in (("gzip", gzip.compress(zeros, 1)), ("deflate", zlib.compress(zeros, 1))):
        assert len(packed) < MAX_DECODED // 100
        upstream.fail_next(Fault(status=200, body=packed, headers={"content-encoding": encoding}))
        with pytest.raises(UpstreamError, match=f"inflates past {MAX_DECODED} bytes") as info:
            await backend.chat(chat())
        assert type(info.value) is UpstreamError  # not Unavailable: another try would get the same


def test_a_status_without_a_message_is_named_once() -> None:
    assert status_error(301, {}, b"").message == "upstream answered HTTP 301"
    assert status_error(418, {}, b"teapot").message == "upstream answered HTTP 418: teapot"


async def test_usage_null_in_a_whole_answer_is_estimated(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    answer = {"id": "c-1", "object": "chat.completion", "created": 1, "model": "m", "usage": None,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "four five"},
                           "finish_reason": "stop"}]}
    upstream.fail_next(Fault(status=200, body=answer))
    result = await backend.chat(chat())
    assert not result.meter.exact and result.meter.prompt_tokens > 0 and result.meter.completion_tokens > 0
    assert msgspec.json.decode(encode_answer(result.response)) == answer  # relayed as it came


async def test_a_whole_answer_led_by_a_byte_order_mark_is_read(backend: OpenAIHTTPBackend,
                                                               upstream: FakeUpstream) -> None:
    """A JSON answer (or error) led by a UTF-8 byte order mark, as some servers send: RFC 8259 lets a
    parser ignore it, and the SDKs do; it was an invalid answer (502)."""
    answer = {"id": "c-1", "object": "chat.completion", "created": 1, "model": "m",
              "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    bom = b"\xef\xbb\xbf"
    upstream.fail_next(Fault(status=200, body=bom + msgspec.json.encode(answer),
                             headers={"content-type": "application/json; charset=utf-8"}))
    result = await backend.chat(chat())
    assert (result.meter.prompt_tokens, result.meter.completion_tokens, result.meter.exact) == (3, 2, True)
    assert msgspec.json.decode(encode_answer(result.response)) == answer
    upstream.fail_next(Fault(status=400, body=bom + b'{"error": {"message": "bad n", "param": "n"}}'))
    with pytest.raises(BadRequest) as info:
        await backend.chat(chat())
    assert (info.value.message, info.value.param) == ("bad n", "n")


async def test_a_whole_answer_to_a_stream_request_says_so(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    """An upstream that does not stream (a JSON answer to ``stream: true``) is named as such."""
    upstream.fail_next(Fault(status=200, body={"id": "c-1", "object": "chat.completion", "choices": []}))
    with pytest.raises(UpstreamError, match="answered a stream request with application/json, not an event stream"):
        await backend.chat_stream(chat(stream=True))


async def test_an_embeddings_answer_is_relayed_with_every_field(backend: OpenAIHTTPBackend,
                                                               upstream: FakeUpstream) -> None:
    """Fields the gateway does not model (vLLM's id and created, usage details) and the vectors' own
    digits reach the client as the upstream sent them; only the model is the gateway's."""
    answer = (b'{"id":"embd-1","object":"list","created":5,"model":"m","data":[{"object":"embedding","index":0,'
              b'"embedding":[0.1000000000000000055511151231257827,-2.5e-1]}],'
              b'"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0}}')
    upstream.fail_next(Fault(status=200, body=answer))
    result = await backend.embed(EmbeddingRequest(model="public", input="x"))
    assert encode_answer(result.response) == answer
    assert result.meter.prompt_tokens == 3 and result.meter.exact
    result.response.model = "public"
    assert encode_answer(result.response) == answer.replace(b'"model":"m"', b'"model":"public"')
    upstream.fail_next(Fault(status=200, body={"object": "list", "model": "m", "usage": None,
                                               "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}]}))
    result = await backend.embed(EmbeddingRequest(model="public", input="one two"))
    assert not result.meter.exact and result.meter.prompt_tokens > 0  # a null usage: our estimate


def test_retry_after_forms() -> None:
    ms = status_error(429, httpx.Headers({"retry-after-ms": "1500"}), b"")
    assert isinstance(ms, RateLimited) and ms.retry_after == 1.5
    date = email.utils.formatdate(time.time() + 120, usegmt=True)
    dated = status_error(429, httpx.Headers({"retry-after": date}), b"")
    assert isinstance(dated, RateLimited) and dated.retry_after is not None and 60 < dated.retry_after <= 120
    assert status_error(429, httpx.Headers({"retry-after": "soon"}), b"").retry_after is None  # type: ignore[attr-defined]
    bad = status_error(400, httpx.Headers(), b'{"error": {"message": "bad n", "param": "n", "code": null}}')
    assert isinstance(bad, BadRequest) and bad.param == "n" and bad.message == "bad n"
    assert isinstance(status_error(400, httpx.Headers(), b'{"error": {"code": "context_length_exceeded"}}'),
                      ContextTooLong)


@pytest.fixture
def tokyo_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The host's local time is UTC+9: a date read as local time is 9 hours early."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("tokyo_time")
def test_a_retry_after_date_ending_in_minus_zero_is_gmt(monkeypatch: pytest.MonkeyPatch) -> None:
    """RFC 5322's ``-0000`` (which ``email.utils.formatdate`` writes) says no zone; an HTTP date is GMT all the same."""
    when = calendar.timegm((2026, 3, 1, 12, 0, 0))  # Sun, 01 Mar 2026 12:00:00 GMT
    monkeypatch.setattr(time, "time", lambda: when - 120.0)
    for date in ("Sun, 01 Mar 2026 12:00:00 -0000", "Sun, 01 Mar 2026 12:00:00 GMT"):
        error = status_error(429, httpx.Headers({"retry-after": date}), b"")
        assert isinstance(error, RateLimited) and error.retry_after == pytest.approx(120.0), date


def test_what_a_429_says_of_the_upstreams_limits() -> None:
    """Whether it names its limits (a bare 429 may be one tenant's own quota), and the tokens left
    of its tokens per minute with the seconds until they reset (OpenAI's duration, Anthropic's time)."""
    def limited(headers: dict[str, str], body: bytes = b"") -> RateLimited:
        error = status_error(429, httpx.Headers(headers), body)
        assert isinstance(error, RateLimited)
        return error

    assert not limited({"retry-after": "5"}).reported
    assert limited({}, b'{"error": {"message": "no credit", "code": "insufficient_quota"}}').reported
    openai_style = limited({"x-ratelimit-remaining-requests": "9", "x-ratelimit-remaining-tokens": "300",
                            "x-ratelimit-reset-tokens": "1m30.5s"})
    assert openai_style.reported and not openai_style.exhausted
    assert (openai_style.tokens_left, openai_style.tokens_reset) == (300.0, 90.5)
    assert limited({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}).tokens_reset == 0.02
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    anthropic = limited({"anthropic-ratelimit-tokens-remaining": "12", "anthropic-ratelimit-tokens-reset": at})
    assert anthropic.tokens_left == 12.0 and anthropic.tokens_reset is not None and 25 < anthropic.tokens_reset <= 30
    for odd in ({"x-ratelimit-remaining-tokens": "lots"}, {"x-ratelimit-remaining-tokens": "nan"}):
        assert limited(odd).tokens_left is None
    assert limited({"x-ratelimit-remaining-tokens": "5", "x-ratelimit-reset-tokens": "soon"}).tokens_reset is None


def test_what_a_successful_answer_says_of_the_upstreams_limits() -> None:
    """The tokens left and the seconds until they reset, as a 429 says them; no request left: no token
    either, until the requests reset; an answer without rate-limit headers (vLLM's) says nothing."""
    assert limits_left({"content-type": "application/json"}) == (None, None)
    said = {"x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "100",
            "x-ratelimit-reset-requests": "120ms", "x-ratelimit-reset-tokens": "6m0s"}
    assert limits_left(said) == (100.0, 360.0)
    assert limits_left(said | {"x-ratelimit-remaining-requests": "0"}) == (0.0, 0.12)
    assert limits_left(said | {"x-ratelimit-remaining-requests": "many"}) == (100.0, 360.0)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    left, reset = limits_left({"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": at,
                               "anthropic-ratelimit-tokens-remaining": "80000"})
    assert left == 0.0 and reset is not None and 25 < reset <= 30


async def test_mid_stream_error_event_raises(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(error_after_chunks=1))
    stream = await backend.chat_stream(chat(stream=True))
    with pytest.raises(UpstreamError):
        async for _ in stream:
            pass
    assert backend.stats().in_flight == 0


async def test_timeouts(upstream: FakeUpstream) -> None:
    b = backend_for(upstream.url, first_byte=0.3, total=0.6)
    try:
        upstream.fail_next(Fault(delay=1.5))
        with pytest.raises(Timeout):
            await b.chat_stream(chat(stream=True))  # no headers within first_byte
        upstream.fail_next(Fault(delay=1.5))
        with pytest.raises(Timeout):
            await b.chat(chat())  # no answer within total
        upstream.fail_next(Fault(hang_after_chunks=1))
        stream = await b.chat_stream(chat(stream=True))
        with pytest.raises(Timeout):
            async for _ in stream:  # the stream stalls past the total deadline
                pass
        assert b.stats().in_flight == 0
    finally:
        await b.aclose()


async def test_unreachable_upstream_is_unavailable_and_not_ready() -> None:
    b = backend_for("http://127.0.0.1:9/v1")
    try:
        with pytest.raises(Unavailable):
            await b.chat(chat())
        assert await b.ready() is False
    finally:
        await b.aclose()


async def test_ready(backend: OpenAIHTTPBackend) -> None:
    assert await backend.ready() is True


async def test_fake_upstream_chunk_count_is_configurable(backend: OpenAIHTTPBackend, upstream: FakeUpstream) -> None:
    upstream.options.output_words = 7
    stream = await backend.chat_stream(chat("ignored", stream=True))
    chunks = [c async for c in stream]
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 7 and stream.meter.completion_tokens == 7


def relayed_chunk(source: bytes) -> ChatCompletionChunk:
    chunk = msgspec.json.decode(source, type=ChatCompletionChunk)
    set_relayed(chunk, msgspec.json.decode(source, type=dict[str, msgspec.Raw]), source)
    return chunk


def test_an_unchanged_answer_is_relayed_byte_for_byte() -> None:
    source = b'{"id": "c1",  "object": "chat.completion.chunk", "model": "m", "choices": [], "x_vendor": {"k": 1}}'
    chunk = relayed_chunk(source)
    assert encode_answer(chunk) == source  # the upstream's own bytes, spacing and unknown fields included
    chunk.model = "public-name"
    renamed = msgspec.json.decode(encode_answer(chunk))
    assert renamed == msgspec.json.decode(source) | {"model": "public-name"}


@pytest.mark.parametrize(("source", "drop_usage"), [
    # "model" also as a value (a token), and as a key of a nested object; escaped; spaced
    (b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"model"}}]}',
     False),
    (b'{"id":"c","object":"chat.completion.chunk","choices":[],"x":{"model":"m"},"model":"m"}', False),
    (b'{"id":"c","object":"chat.completion.chunk","model":"\\u006d","choices":[]}', False),
    (b'{"id":"c","object":"chat.completion.chunk","model" :\n "m","choices":[]}', False),
    # the usage the client did not ask for, null (each chunk's) or counted (the last), wherever it sits
    (b'{"usage" : null , "id":"c","object":"chat.completion.chunk","model":"m","choices":[]}', True),
    (b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":null,"x":{"usage":null}}', True),
    (b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],'
     b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},"x_vendor":1}', True),
])
def test_a_renamed_answer_keeps_every_other_field(source: bytes, drop_usage: bool) -> None:
    chunk = relayed_chunk(source)
    chunk.model = "public-name"
    expected = msgspec.json.decode(source) | {"model": "public-name"}
    if drop_usage:
        chunk.usage = msgspec.UNSET
        del expected["usage"]
    assert msgspec.json.decode(encode_answer(chunk)) == expected


@pytest.mark.parametrize("name", ["conflict_error", "conflict"])
def test_a_conflict_named_in_an_error_object_is_a_conflict(name: str) -> None:
    """Anthropic's ``conflict_error`` (and a bare ``conflict`` code) sent as a stream's first event or a
    2xx body is the 409 it stands for: retried elsewhere, no fault of the deployment."""
    error = event_error(ErrorDetail(message="try again", type=name))
    assert isinstance(error, Conflict) and error.retryable and not error.blames_deployment
    assert "try again" in str(error)
