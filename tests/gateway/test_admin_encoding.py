"""Compressed admin request bodies: the admin API undoes gzip and deflate as the OpenAI routes do
(``gateway.body.decoded_content``), within the same body limit (413 past it), with the same 400 for
a body that does not inflate and the same 415 for any other coding; against the real app on
PostgreSQL."""

from __future__ import annotations

import gzip
import json
import uuid
import zlib
from collections.abc import Callable

import httpx
import pytest

from tests.gateway.tenancy_fixtures import migrated_pg_url, pg_admin_api  # noqa: F401  (fixtures)

Pack = Callable[[bytes], bytes]


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODINGS: list[tuple[str, Pack]] = [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("deflate", zlib.compress),  # zlib-wrapped
    ("deflate", _raw_deflate),  # raw
    ("identity", lambda data: data),
    ("gzip, gzip", lambda data: gzip.compress(gzip.compress(data))),
]


@pytest.fixture(scope="module")
def admin(pg_admin_api: httpx.Client) -> httpx.Client:
    return pg_admin_api


def _send(admin: httpx.Client, method: str, path: str, body: bytes, encoding: str) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": encoding}
    return admin.request(method, path, content=body, headers=headers)


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(("encoding", "pack"), ENCODINGS,
                         ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw", "identity", "gzip-twice"])
def test_compressed_admin_bodies_are_decoded(admin: httpx.Client, encoding: str, pack: Pack) -> None:
    name = f"enc-{uuid.uuid4().hex[:8]}"
    created = _send(admin, "POST", "/admin/v1/tenants", pack(_json({"name": name})), encoding)
    assert created.status_code == 201, created.text
    assert created.json()["name"] == name
    tid = created.json()["id"]
    limits = _send(admin, "PUT", f"/admin/v1/tenants/{tid}/limits", pack(_json({"requests_per_minute": 7})), encoding)
    assert limits.status_code == 200 and limits.json()["requests_per_minute"] == 7, limits.text
    key = _send(admin, "POST", "/admin/v1/keys", pack(_json({"tenant_id": tid})), encoding)
    assert key.status_code == 201, key.text
    rotated = _send(admin, "POST", f"/admin/v1/keys/{key.json()['id']}/rotate", pack(_json({"grace_seconds": 0})),
                    encoding)  # a route that reads its optional body itself
    assert rotated.status_code == 201, rotated.text


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br"])
def test_other_encodings_are_415(admin: httpx.Client, encoding: str) -> None:
    answer = _send(admin, "POST", "/admin/v1/tenants", _json({"name": "never"}), encoding)
    assert answer.status_code == 415, answer.text
    error = answer.json()["error"]
    assert error["code"] == "unsupported_content_encoding" and "Content-Encoding" in error["message"]
    assert "never" not in admin.get("/admin/v1/tenants").text


def test_a_bomb_stops_at_the_body_limit(admin: httpx.Client) -> None:
    bomb = gzip.compress(b'{"name": "' + b" " * (64 * 1024 * 1024) + b'"}')
    assert len(bomb) < 100_000
    answer = _send(admin, "POST", "/admin/v1/tenants", bomb, "gzip")
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"


def test_a_body_that_does_not_inflate_is_400_naming_the_encoding(admin: httpx.Client) -> None:
    answer = _send(admin, "POST", "/admin/v1/tenants", _json({"name": "plain"}), "gzip")
    assert answer.status_code == 400 and "not valid gzip data" in answer.json()["error"]["message"]
