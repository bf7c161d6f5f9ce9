"""Raw HTTP against the gateway: malformed bodies, routing errors, schema, health. Never a 5xx."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv

AUTH = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}


@pytest.fixture
def http(env: GatewayEnv) -> httpx.Client:
    with httpx.Client(base_url=env.server.url, headers=AUTH, timeout=10) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{", None),
        (b"not json at all", None),
        (b"[]", None),
        (b'"just a string"', None),
        (b"{}", "model"),
        (b'{"model": "echo"}', "messages"),
        (b'{"model": 5, "messages": []}', "model"),
        (b'{"model": "echo", "messages": "hi"}', "messages"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}', "max_tokens"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": [{"type": "video"}]}]}',
            "messages[0].content[0].type",
        ),
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
            "response_format.type",
        ),
    ],
)
def test_malformed_chat_bodies_are_400(http: httpx.Client, body: bytes, param: str | None) -> None:
    error = assert_openai_error(http.post("/v1/chat/completions", content=body), 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_absurdly_nested_json_is_400(http: httpx.Client) -> None:
    depth = 100_000
    body = (
        b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "tools": [{"function": '
        b'{"name": "f", "parameters": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}}]}"
    )
    assert assert_openai_error(http.post("/v1/chat/completions", content=body), 400)["code"] == "invalid_json"


def test_half_a_surrogate_pair_is_named(http: httpx.Client) -> None:
    """Half an emoji (a high surrogate escape alone, as JavaScript's slicing leaves it) is said to
    be that, not "Input data was truncated"; an escaped backslash before ``u`` is no escape."""
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "x\\\\ud83d y \\ud83d"}]}'
    error = assert_openai_error(http.post("/v1/chat/completions", content=body), 400)
    assert error["code"] == "invalid_json"
    assert "\\ud83d at byte 71 is half of a UTF-16 surrogate pair" in error["message"]
    whole = b'{"model": "echo", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert http.post("/v1/chat/completions", content=whole).status_code == 200
    cut = assert_openai_error(http.post("/v1/chat/completions", content=b'{"model": "ech'), 400)
    assert "truncated" in cut["message"]


def test_empty_body_is_400(http: httpx.Client) -> None:
    assert_openai_error(http.post("/v1/chat/completions", content=b""), 400)
    assert_openai_error(http.post("/v1/completions", content=b""), 400)


def test_auth_comes_before_body_validation(env: GatewayEnv) -> None:
    response = httpx.post(env.server.url + "/v1/chat/completions", content=b"{garbage")
    assert assert_openai_error(response, 401)["code"] == "missing_api_key"
    response = httpx.get(env.server.url + "/v1/models", headers={"authorization": "Basic abc"})
    assert_openai_error(response, 401)


def test_huge_bodies_are_413(http: httpx.Client) -> None:
    big = b'{"model": "echo", "messages": [{"role": "user", "content": "' + b"x" * 5_000_000 + b'"}]}'
    assert_openai_error(http.post("/v1/chat/completions", content=big), 413)

    def chunked():  # no content-length: the limit applies to the bytes actually received
        for _ in range(50):
            yield b"x" * 200_000

    assert_openai_error(http.post("/v1/completions", content=chunked()), 413)


def test_unknown_route_and_wrong_method(http: httpx.Client, caplog: pytest.LogCaptureFixture) -> None:
    """No route takes them, yet each is an API answer: its own ``x-request-id`` and access line."""
    answers = [http.post("/v1/nothing-here", content=b"{}"), http.get("/v1/chat/completions"),
               http.delete("/v1/models"), http.post("/v1/messages/nope", json={})]
    assert assert_openai_error(answers[0], 404)["code"] == "unknown_url"
    assert assert_openai_error(answers[1], 405)["code"] == "method_not_allowed"
    assert_openai_error(answers[2], 405)
    assert answers[3].status_code == 404 and answers[3].json()["type"] == "error"  # Anthropic's shape there
    ids = [a.headers.get("x-request-id") for a in answers]
    assert all(ids) and len(set(ids)) == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "switchyard.access"]
    for line in ("POST /v1/nothing-here 404", "GET /v1/chat/completions 405", "DELETE /v1/models 405"):
        assert line in lines
    assert "x-request-id" not in http.get("/nothing-here").headers  # not an API path: no id, as before


def test_fuzzed_bodies_never_5xx(http: httpx.Client) -> None:
    rng = random.Random(1234)
    valid = {"model": "echo", "messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 3}
    values = [None, True, -1, 0, 3.5, 1e308, "", "x" * 100, [], {}, [1, "a"], {"a": {"b": []}}, -(2**70)]
    keys = [
        "model",
        "messages",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "response_format",
        "stream",
        "stream_options",
        "logit_bias",
        "max_tokens",
        "prompt",
        "user",
        "unknown_field",
    ]
    for i in range(120):
        if i % 3 == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        else:
            doc = dict(valid)
            for _ in range(rng.randrange(1, 4)):
                doc[rng.choice(keys)] = rng.choice(values)
            if i % 5 == 0:
                doc["messages"] = [{"role": rng.choice(["user", "tool", "x"]), "content": rng.choice(values)}]
            body = json.dumps(doc).encode()
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        response = http.post(path, content=body)
        assert response.status_code < 500, (body, response.text)
        if response.status_code >= 400:
            assert_openai_error(response, response.status_code)


def test_openapi_schema_documents_the_routes(http: httpx.Client) -> None:
    schema = http.get("/schema/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert chat["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "422" not in chat["responses"]
    completions = schema["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/CompletionRequest")
    models = schema["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert models["$ref"].endswith("/ModelList")
    request_schema = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(request_schema["required"])
    assert "temperature" in request_schema["properties"]


def test_health_and_readiness(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 503  # the "dead" model's only deployment is unreachable
    body = ready.json()
    assert body["models"] == {"echo": True, "other": True, "impatient": True, "trimmed": True, "dead": False}
