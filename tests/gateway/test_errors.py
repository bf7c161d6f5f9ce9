"""Every error class reaches the openai SDK as its typed exception, in OpenAI's error shape."""

from __future__ import annotations

import gzip
import json

import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import LIMITED_KEY, THROTTLED_KEY, GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault

MESSAGES = [{"role": "user", "content": "hi"}]


def sdk(env: GatewayEnv, key: str = ADMIN_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=key, max_retries=0)


def test_bad_key_is_401(env: GatewayEnv) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        sdk(env, "sk-wrong").chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert err.value.body["type"] == "authentication_error"  # type: ignore[index]


def test_model_not_allowed_is_403(env: GatewayEnv) -> None:
    with pytest.raises(openai.PermissionDeniedError) as err:
        sdk(env, LIMITED_KEY).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.code == "model_not_allowed" and err.value.param == "model"
    assert sdk(env, LIMITED_KEY).chat.completions.create(model="other", messages=MESSAGES).choices


def test_unknown_model_is_404(env: GatewayEnv) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        sdk(env).chat.completions.create(model="nope", messages=MESSAGES)
    assert err.value.code == "model_not_found" and err.value.param == "model"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"n": 0}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_logprobs": 30, "logprobs": True}, "top_logprobs"),
        ({"stop": [str(i) for i in range(1025)]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"seed": 2**70}, "seed"),
        ({"extra_body": {"top_k": 2**63}}, "top_k"),
    ],
)
def test_out_of_range_is_400_naming_the_param(env: GatewayEnv, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, **kwargs)
    assert err.value.param == param
    assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_wrong_message_shape_is_400(env: GatewayEnv) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=[{"role": "wizard", "content": "x"}])  # type: ignore[list-item]
    assert err.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=[])
    assert err.value.param == "messages"


def test_mixed_prompt_is_400(env: GatewayEnv) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).completions.create(model="echo", prompt=["text", 3])  # type: ignore[list-item]
    assert err.value.param == "prompt"


def test_huge_body_is_413(env: GatewayEnv) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="echo", messages=[{"role": "user", "content": "x" * 5_000_000}])
    assert err.value.status_code == 413 and err.value.code == "request_too_large"


def test_quota_exceeded_is_429_with_retry_after(env: GatewayEnv) -> None:
    with pytest.raises(openai.RateLimitError) as err:
        sdk(env, THROTTLED_KEY).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.response.headers["retry-after"] == "7"
    assert err.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.value.code == "rate_limit_exceeded"


def test_upstream_429_is_429_with_retry_after(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=429, headers={"retry-after": "3"}))
    with pytest.raises(openai.RateLimitError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.response.headers["retry-after"] == "3"
    assert env.usage.wait_for(1)[0].status == 429


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_5xx_passes_its_retry_after_on(env: GatewayEnv, upstream: FakeUpstream, stream: bool) -> None:
    """An overloaded upstream's ``Retry-After`` on its 503 reaches the client (the SDKs wait that long
    before their retry), as a 429's does; a 5xx without one gets none."""
    upstream.fail_next(Fault(status=503, headers={"retry-after": "30"}), Fault(status=500))
    with pytest.raises(openai.InternalServerError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "30"
    with pytest.raises(openai.InternalServerError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    assert "retry-after" not in err.value.response.headers


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        (Fault(status=500), 503, "upstream_unavailable"),
        (Fault(status=503), 503, "upstream_unavailable"),
        (Fault(status=200, body=b"this is not json"), 502, "bad_upstream_response"),
        (Fault(status=401), 502, "upstream_auth"),
        (Fault(status=418), 502, "bad_upstream_response"),
    ],
)
def test_upstream_failures_map_to_5xx(env: GatewayEnv, upstream: FakeUpstream, fault: Fault, status: int,
                                      code: str) -> None:
    upstream.fail_next(fault)
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.status_code == status and err.value.code == code


def test_upstream_bad_request_and_context_length(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=400, body={"error": {"message": "bad logit_bias", "type": "invalid_request_error",
                                                         "param": "logit_bias", "code": None}}))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.param == "logit_bias"
    upstream.fail_next(Fault(status=400, body={"error": {"message": "This model's maximum context length is 8 tokens",
                                                         "code": "context_length_exceeded"}}))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.code == "context_length_exceeded"


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_bad_request_keeps_its_own_code(env: GatewayEnv, upstream: FakeUpstream, stream: bool) -> None:
    """An upstream 400's ``code`` (OpenAI's ``unsupported_parameter``, ``invalid_prompt``, ...) is what a
    client branches on: relayed, not replaced by the error's type; vLLM's numeric code is no such name."""
    body = {"error": {"message": "temperature is not supported", "type": "invalid_request_error",
                      "param": "temperature", "code": "unsupported_parameter"}}
    upstream.fail_next(Fault(status=400, body=body))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    assert (err.value.code, err.value.param) == ("unsupported_parameter", "temperature")
    upstream.fail_next(Fault(status=400, body={"object": "error", "message": "bad n", "type": "BadRequestError",
                                               "param": None, "code": 400}))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).completions.create(model="echo", prompt="hi", stream=stream)
    assert err.value.code == "invalid_request_error" and err.value.body["message"] == "bad n"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_a_compressed_upstream_error_reads_as_its_status(env: GatewayEnv, upstream: FakeUpstream,
                                                         stream: bool) -> None:
    """An error answer gzipped unasked (a proxy in front of the upstream) is the error it holds,
    for a stream request too: not an unreachable upstream (503), retried elsewhere."""
    gzipped = {"content-type": "application/json", "content-encoding": "gzip"}
    body = gzip.compress(json.dumps({"error": {"message": "bad temperature", "type": "invalid_request_error",
                                               "param": "temperature", "code": None}}).encode())
    upstream.fail_next(Fault(status=400, body=body, headers=gzipped))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    assert (err.value.param, err.value.body["message"]) == ("temperature", "bad temperature")  # type: ignore[index]
    upstream.fail_next(Fault(status=429, body=gzip.compress(b"slow down"), headers=gzipped | {"retry-after": "4"}))
    with pytest.raises(openai.RateLimitError) as limited:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=stream)
    assert limited.value.response.headers["retry-after"] == "4"
    assert limited.value.body["message"] == "slow down"  # type: ignore[index]


def test_a_fastapi_upstream_error_reads_as_one(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """Upstreams written with FastAPI answer ``{"detail": ...}``: its text, or a validation error's
    items, is the message (not the raw JSON), the first item's body field the ``param``."""
    loc = {"loc": ["body", "messages", 0, "content"], "msg": "Field required", "type": "missing"}
    upstream.fail_next(Fault(status=422, body={"detail": [loc, {"loc": ["query", "v"], "msg": "bad"}]}))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.body["message"] == "messages[0].content: Field required; bad"  # type: ignore[index]
    assert err.value.param == "messages[0].content"
    upstream.fail_next(Fault(status=400, body={"detail": "Model is still loading"}))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES)
    assert err.value.body["message"] == "Model is still loading"  # type: ignore[index]


def test_upstream_timeout_is_504(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(delay=2.0))
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="impatient", messages=MESSAGES)
    assert err.value.status_code == 504
    upstream.fail_next(Fault(delay=2.0))
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="impatient", messages=MESSAGES, stream=True)
    assert err.value.status_code == 504


def test_unreachable_upstream_is_503(env: GatewayEnv) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="dead", messages=MESSAGES)
    assert err.value.status_code == 503


def test_stream_errors_before_first_chunk_are_http_errors(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=503))
    with pytest.raises(openai.APIStatusError) as err:
        sdk(env).chat.completions.create(model="echo", messages=MESSAGES, stream=True)
    assert err.value.status_code == 503


def test_a_stream_broken_mid_way_is_recorded_as_one_broken_before_it(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """The same failure (the upstream ends the body early) has one error_type, whenever it comes."""
    upstream.fail_next(Fault(end_after_chunks=2))
    with pytest.raises(openai.APIError):
        for _ in sdk(env).chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b"}],
                                                  stream=True):
            pass
    assert env.usage.wait_for(1)[0].error_type == "unavailable"  # Unavailable's kind, as before a first chunk


def test_stream_error_mid_way_is_an_error_event(env: GatewayEnv, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(error_after_chunks=2))
    stream = sdk(env).chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c"}],
                                              stream=True)
    received = []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            received.append(chunk)
    assert len(received) == 2
    assert "mid-stream" in err.value.message
    record = env.usage.wait_for(1)[0]
    assert record.error_type == "upstream_error" and record.extra == {"outcome": "failed"}
