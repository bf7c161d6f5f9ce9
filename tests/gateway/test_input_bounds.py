"""Optional embeddings fields take null (the default) as OpenAI does; a bad ``dimensions``, an empty
embeddings input and an empty token list in a completions batch are refused at the gateway, before
anything goes upstream."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream


def post(env: GatewayEnv, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{env.base_url}{path}", json=body, headers={"authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=30)


@pytest.mark.parametrize("field", ["encoding_format", "dimensions", "user"])
def test_embeddings_take_null_for_an_optional_field(env: GatewayEnv, upstream: FakeUpstream, field: str) -> None:
    answer = post(env, "/embeddings", {"model": "echo", "input": "one two", field: None})
    assert answer.status_code == 200, answer.text[:300]
    assert isinstance(answer.json()["data"][0]["embedding"], list)  # null encoding_format: floats
    sent = upstream.last.json
    if field == "encoding_format":
        assert "encoding_format" not in sent  # the default, left out (vLLM's field is not nullable)
    else:
        assert sent[field] is None  # relayed as sent


@pytest.mark.parametrize("dimensions", [0, -1, 65537, 10**23, 1.5, True])
def test_embeddings_refuse_dimensions_out_of_bounds(env: GatewayEnv, upstream: FakeUpstream,
                                                    dimensions: Any) -> None:
    answer = post(env, "/embeddings", {"model": "echo", "input": "one two", "dimensions": dimensions})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["param"] == "dimensions"
    assert not upstream.received


def test_embeddings_take_the_largest_dimensions(env: GatewayEnv, upstream: FakeUpstream) -> None:
    answer = post(env, "/embeddings", {"model": "echo", "input": "one", "dimensions": 65536,
                                          "encoding_format": "base64"})
    assert answer.status_code == 200, answer.text[:300]
    assert upstream.last.json["dimensions"] == 65536


@pytest.mark.parametrize(("given", "param"), [
    ("", "input"), (["a", ""], "input[1]"), ([[1, 2], []], "input[1]"), ([[]], "input[0]"),
])
def test_embeddings_name_the_empty_input_of_a_batch(env: GatewayEnv, upstream: FakeUpstream, given: Any,
                                                    param: str) -> None:
    """An empty string or token list is refused as ``input`` of a completions batch is: by its index."""
    answer = post(env, "/embeddings", {"model": "echo", "input": given})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value") and param in error["message"]
    assert not upstream.received


@pytest.mark.parametrize("prompt", [[[1, 2], []], [[]]])
def test_completions_refuse_an_empty_token_list(env: GatewayEnv, upstream: FakeUpstream, prompt: Any) -> None:
    answer = post(env, "/completions", {"model": "echo", "prompt": prompt, "max_tokens": 2})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith("prompt")
    assert not upstream.received


@pytest.mark.parametrize("prompt", ["", ["a b", ""]])
def test_completions_take_an_empty_string_prompt(env: GatewayEnv, upstream: FakeUpstream, prompt: Any) -> None:
    """As OpenAI: an empty string is a valid prompt, alone or in a batch (its default is ``""``)."""
    answer = post(env, "/completions", {"model": "echo", "prompt": prompt, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    assert upstream.last.json["prompt"] == prompt
