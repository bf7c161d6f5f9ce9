"""Compressed request bodies (``Content-Encoding``): gzip and deflate are undone before decoding,
never past the gateway's maximum body size (413, so a small bomb cannot inflate), and any other
coding is a 415 in OpenAI's error shape; on the direct routes (gateway.fast_routes) and Litestar's."""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Iterator

import httpx
import pytest
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from gateway.body import MAX_GZIP_MEMBERS, decoded_content
from gateway.errors import ApiError
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import ROUTES, GatewayEnv, served_by
from tests.support.fake_upstream import FakeUpstream

CHAT = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi there"}]}).encode()
EMBED = json.dumps({"model": "echo", "input": "hi there"}).encode()
PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": json.dumps({"model": "echo", "prompt": "hi"}).encode(),
         "/v1/embeddings": EMBED}


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, env: GatewayEnv) -> Iterator[str]:
    """Each test on the direct route (gateway.fast_routes) and on Litestar's."""
    with served_by(env, request.param) as served:
        yield served


def _post(env: GatewayEnv, path: str, body: bytes, encoding: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return httpx.post(env.server.url + path, content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("encoding", "pack"), [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("GZip", gzip.compress),
    ("deflate", zlib.compress),  # zlib-wrapped, as RFC 9110 says
    ("deflate", _raw_deflate),  # raw, as some clients send
    ("identity", lambda data: data),
    ("gzip, gzip", lambda data: gzip.compress(gzip.compress(data))),
    ("gzip", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),  # two members
], ids=["gzip", "x-gzip", "mixed-case", "deflate-zlib", "deflate-raw", "identity", "gzip-twice", "gzip-members"])
def test_compressed_body_is_decoded(env: GatewayEnv, upstream: FakeUpstream, route: str, path: str,
                                    encoding: str, pack: object) -> None:
    answer = _post(env, path, pack(PATHS[path]), encoding)  # type: ignore[operator]
    assert answer.status_code == 200, answer.text
    assert upstream.last.json["model"] == "upstream-echo"
    assert {k: v for k, v in upstream.last.json.items() if k != "model" and k in json.loads(PATHS[path])} == {
        k: v for k, v in json.loads(PATHS[path]).items() if k != "model"}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_unsupported_encoding_is_415(env: GatewayEnv, upstream: FakeUpstream, route: str, path: str,
                                     encoding: str) -> None:
    answer = _post(env, path, PATHS[path], encoding)
    assert answer.status_code == 415
    error = answer.json()["error"]
    assert "Content-Encoding" in error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_content_encoding"
    assert upstream.received == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_bomb_stops_at_the_body_limit(env: GatewayEnv, upstream: FakeUpstream, route: str, path: str) -> None:
    bomb = gzip.compress(b'{"model": "echo", "input": "' + b" " * (64 * 1024 * 1024) + b'"}')
    assert len(bomb) < 100_000
    answer = _post(env, path, bomb, "gzip")
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert upstream.received == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
@pytest.mark.parametrize(("encoding", "body"), [
    ("gzip", CHAT),  # not compressed at all
    ("gzip", gzip.compress(CHAT)[:-9]),  # cut short
    ("gzip", gzip.compress(CHAT) + b"junk"),
    ("deflate", gzip.compress(CHAT)),
], ids=["plain", "truncated", "trailing-junk", "gzip-as-deflate"])
def test_undecodable_body_is_400_naming_the_encoding(env: GatewayEnv, upstream: FakeUpstream, route: str,
                                                      path: str, encoding: str, body: bytes) -> None:
    answer = _post(env, path, body, encoding)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert f"not valid {encoding} data" in error["message"] and "NUL" not in error["message"]
    assert upstream.received == []


def test_decoded_size_is_bounded_exactly() -> None:
    data = b"x" * 1000
    assert decoded_content(gzip.compress(data), "gzip", 1000) == data
    assert decoded_content(gzip.compress(data[:400]) + gzip.compress(data[400:]), "gzip", 1000) == data
    with pytest.raises(RequestEntityTooLarge):
        decoded_content(gzip.compress(data + b"x"), "gzip", 1000)
    with pytest.raises(RequestEntityTooLarge):  # the members together
        decoded_content(gzip.compress(data) + gzip.compress(b"x"), "gzip", 1000)
    with pytest.raises(ApiError) as caught:
        decoded_content(data, "br, gzip", 1000)
    assert caught.value.status == 415 and "'br'" in caught.value.message


def test_a_body_of_many_gzip_members_is_refused_quickly() -> None:
    """Thousands of empty members inflate to nothing; each would cost a copy of the rest of the
    body (seconds of the event loop for a few MB): more than MAX_GZIP_MEMBERS is a 400."""
    assert decoded_content(gzip.compress(b"") * (MAX_GZIP_MEMBERS - 1) + gzip.compress(b"{}"), "gzip", 1000) == b"{}"
    started = time.perf_counter()
    with pytest.raises(ApiError) as caught:
        decoded_content(gzip.compress(b"") * 200_000, "gzip", 8 << 20)  # 4 MB of empty members
    assert caught.value.status == 400 and time.perf_counter() - started < 1
