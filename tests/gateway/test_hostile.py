"""Hostile input (issue 22) against a served gateway on loopback: numbers out of range, NUL
characters and missing security headers each get a clear answer, never a 5xx."""

from __future__ import annotations

import httpx
import pytest

from backends.openai_wire import MAX_TOKEN_COUNT
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = [{"role": "user", "content": "hi"}]


def _post(env: GatewayEnv, path: str, body: dict[str, object] | bytes) -> httpx.Response:
    kwargs: dict[str, object] = {"content": body} if isinstance(body, bytes) else {"json": body}
    headers = AUTH | ({"Content-Type": "application/json"} if isinstance(body, bytes) else {})
    return httpx.post(env.server.url + path, headers=headers, timeout=10, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [2**63, 2**64 + 5, MAX_TOKEN_COUNT + 1, -1])
def test_token_counts_out_of_range_are_a_400_naming_the_field(env: GatewayEnv, field: str, value: int) -> None:
    response = _post(env, "/v1/chat/completions", {"model": "echo", "messages": CHAT, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field
    assert error["type"] == "invalid_request_error"
    assert str(MAX_TOKEN_COUNT) in error["message"] or "0" in error["message"]


def test_completions_max_tokens_out_of_range_is_a_400(env: GatewayEnv) -> None:
    response = _post(env, "/v1/completions", {"model": "echo", "prompt": "x", "max_tokens": 2**63})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "max_tokens"


def test_largest_allowed_token_count_is_not_a_5xx(env: GatewayEnv) -> None:
    response = _post(env, "/v1/chat/completions", {"model": "echo", "messages": CHAT, "max_tokens": MAX_TOKEN_COUNT})
    assert response.status_code < 500, response.text


@pytest.mark.parametrize(("body", "param"), [
    (b'{"model": "echo", "messages": [{"role": "user", "content": "a\\u0000b"}]}', "messages[0].content"),
    (b'{"model": "echo\\u0000", "messages": [{"role": "user", "content": "ab"}]}', "model"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": "a\\\\\\u0000b"}]}', "messages[0].content"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": "ab"}], "meta\\u0000": 1}', "meta\x00"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": "a\x00b"}]}', None),  # a raw NUL: not JSON
])
def test_nul_characters_are_refused_with_a_400_naming_the_field(env: GatewayEnv, body: bytes,
                                                                param: str | None) -> None:
    response = _post(env, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "NUL" in error["message"] and error["param"] == param


def test_an_escaped_backslash_before_u0000_is_not_a_nul(env: GatewayEnv) -> None:
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "path C:\\\\u0000"}]}'
    response = _post(env, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/v1/models", "/v1/nope", "/health"])
def test_every_response_says_nosniff(env: GatewayEnv, path: str) -> None:
    for headers in (AUTH, {}):
        response = httpx.get(env.server.url + path, headers=headers, timeout=10)
        assert response.headers["x-content-type-options"] == "nosniff", (path, response.status_code)


def test_dashboard_paths_deny_framing_and_carry_a_csp(env: GatewayEnv) -> None:
    response = httpx.get(env.server.url + "/dashboard/login", timeout=10)
    assert response.headers["x-frame-options"] == "DENY"
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"


def test_messages_max_tokens_out_of_range_is_a_400(env: GatewayEnv) -> None:
    response = _post(env, "/v1/messages", {"model": "echo", "max_tokens": 2**63, "messages": CHAT})
    assert response.status_code == 400, response.text
    assert "max_tokens" in response.text


def test_a_streamed_answer_carries_the_headers_of_every_wrapper(env: GatewayEnv) -> None:
    """A stream's body goes straight to the server (gateway.event_stream); its start message still
    passes the before_send hook (nosniff) and the telemetry middleware (the request id)."""
    body = {"model": "echo", "messages": CHAT, "stream": True}
    with httpx.stream("POST", env.server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-request-id"]
        assert r.headers["content-type"].startswith("text/event-stream")
        events = b"".join(r.iter_bytes())
    assert events.count(b"data: ") >= 2 and events.rstrip().endswith(b"data: [DONE]")
