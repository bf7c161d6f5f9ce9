"""The busiest routes served directly (gateway.fast_routes) answer exactly as Litestar's routes do:
the same requests, on one served gateway, with the direct path on and then off."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from litestar import Litestar, Response, post
from litestar.datastructures import ResponseHeader

from gateway.fast_routes import _adds_nothing, _post_handler
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import LIMITED_KEY, THROTTLED_KEY, GatewayEnv

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
JSON = {"Content-Type": "application/json"}
VOLATILE = {"date", "x-request-id", "content-length"}  # differ from one answer to the next

CASES: dict[str, tuple[str, dict[str, str], bytes | list[bytes]]] = {
    "chat": ("/v1/chat/completions", ADMIN | JSON, json.dumps(CHAT).encode()),
    "chat without /v1": ("/chat/completions", ADMIN | JSON, json.dumps(CHAT).encode()),
    "text completion": ("/v1/completions", ADMIN | JSON, json.dumps({"model": "echo", "prompt": "hi"}).encode()),
    "stream": ("/v1/chat/completions", ADMIN | JSON, json.dumps(CHAT | {"stream": True}).encode()),
    "no key": ("/v1/chat/completions", JSON, json.dumps(CHAT).encode()),
    "wrong key": ("/v1/chat/completions", {"Authorization": "Bearer sk-nope"} | JSON, json.dumps(CHAT).encode()),
    "model not allowed": ("/v1/chat/completions", {"Authorization": f"Bearer {LIMITED_KEY}"} | JSON,
                          json.dumps(CHAT).encode()),
    "rate limited": ("/v1/chat/completions", {"Authorization": f"Bearer {THROTTLED_KEY}"} | JSON,
                     json.dumps(CHAT).encode()),
    "unknown model": ("/v1/chat/completions", ADMIN | JSON, json.dumps(CHAT | {"model": "nope"}).encode()),
    "empty body": ("/v1/chat/completions", ADMIN | JSON, b""),
    "not JSON": ("/v1/chat/completions", ADMIN | JSON, b"{nope"),
    "missing messages": ("/v1/chat/completions", ADMIN | JSON, b'{"model": "echo"}'),
    "wrong type": ("/v1/completions", ADMIN | JSON, b'{"model": "echo", "prompt": "x", "max_tokens": "many"}'),
    "form content type": ("/v1/chat/completions", ADMIN | {"Content-Type": "application/x-www-form-urlencoded"},
                          json.dumps(CHAT).encode()),
    "too large": ("/v1/chat/completions", ADMIN | JSON, b'{"pad": "' + b"x" * (5 * 1024 * 1024) + b'"}'),
    "chunked": ("/v1/chat/completions", ADMIN | JSON, [json.dumps(CHAT).encode()[:9], json.dumps(CHAT).encode()[9:]]),
    "too large, chunked": ("/v1/chat/completions", ADMIN | JSON, [b'{"pad": "', *[b"x" * 65536] * 80, b'"}']),
}


@pytest.fixture
def direct_off(env: GatewayEnv) -> Iterator[None]:
    fast, env.server.app.fast_routes = env.server.app.fast_routes, None
    try:
        yield
    finally:
        env.server.app.fast_routes = fast


def _answer(env: GatewayEnv, path: str, headers: dict[str, str],
            body: bytes | list[bytes]) -> tuple[int, set[str], object]:
    content = body if isinstance(body, bytes) else iter(body)  # pieces: sent chunked, with no length announced
    response = httpx.post(env.server.url + path, headers=headers, content=content, timeout=30)
    names = {name for name in response.headers if name not in VOLATILE}
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        content: object = [line.split(b":")[0] for line in response.content.splitlines()]  # the events' shape
    elif response.status_code == 200:
        content = sorted(response.json())  # ids and timestamps differ; the fields do not
    else:
        content = response.json()
    return response.status_code, names, content


@pytest.mark.parametrize("case", list(CASES))
def test_the_direct_route_answers_as_litestar_does(env: GatewayEnv, case: str, request: pytest.FixtureRequest) -> None:
    assert env.server.app.fast_routes is not None and env.server.app.fast_routes.serves(
        {"type": "http", "method": "POST", "path": CASES[case][0]})
    direct = _answer(env, *CASES[case])
    request.getfixturevalue("direct_off")
    assert env.server.app.fast_routes is None
    assert direct == _answer(env, *CASES[case])
    assert direct[0] == (413 if case.startswith("too large") else direct[0]) != 500
    if direct[0] == 400:  # every refusal of a body names its kind
        assert isinstance(direct[2], dict) and direct[2]["error"]["code"], direct


def test_a_route_that_adds_to_its_responses_keeps_litestars_conversion() -> None:
    """A completion goes out without ``to_response`` only from a route that adds nothing to it."""
    @post("/plain", status_code=200)
    async def plain() -> Response[bytes]:
        return Response(b"")

    @post("/headed", status_code=200, response_headers=[ResponseHeader(name="x-extra", value="1")])
    async def headed() -> Response[bytes]:
        return Response(b"")

    @post("/created")
    async def created() -> Response[bytes]:
        return Response(b"")

    app = Litestar([plain, headed, created])
    assert [_adds_nothing(_post_handler(app, p)) for p in ("/plain", "/headed", "/created")] == [True, False, False]
