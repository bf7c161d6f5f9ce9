"""An engine node's own key: who may call it, what it says when anyone may, and that the key stays secret."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from engine.tiny_model import build_tiny_model
from tests.support.engine_nodes import EngineNode

NODE_KEY = "sk-node-auth-secret-7f3a"
WARNING = "without --api-key"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=5)


@pytest.fixture(scope="module")
def nodes(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineNode, EngineNode]]:
    """(keyed, open) nodes, both listening on every interface."""
    workdir = tmp_path_factory.mktemp("nodes")
    keyed = EngineNode(model, workdir, "keyed", "--host", "0.0.0.0", "--num-kv-blocks", "128", api_key=NODE_KEY)
    unkeyed = EngineNode(model, workdir, "open", "--host", "0.0.0.0", "--num-kv-blocks", "128")
    try:
        for n in (keyed, unkeyed):
            n.launch()
        for n in (keyed, unkeyed):
            n.wait_ready()
        yield keyed, unkeyed
    finally:
        for n in (keyed, unkeyed):
            n.stop()


def test_a_node_open_to_every_interface_without_a_key_warns(nodes: tuple[EngineNode, EngineNode]) -> None:
    keyed, unkeyed = nodes
    assert WARNING in unkeyed.log_path.read_text()
    assert WARNING not in keyed.log_path.read_text()


def test_the_node_key_guards_every_api_route_and_never_reaches_the_log(nodes: tuple[EngineNode, EngineNode]) -> None:
    keyed, _ = nodes
    ok = openai.OpenAI(base_url=keyed.url + "/v1", api_key=NODE_KEY, max_retries=0)
    assert ok.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2).usage
    with pytest.raises(openai.AuthenticationError) as wrong:
        openai.OpenAI(base_url=keyed.url + "/v1", api_key=NODE_KEY + "x", max_retries=0).models.list()
    assert wrong.value.code == "invalid_api_key"
    assert httpx.get(keyed.url + "/v1/models", headers={"x-api-key": NODE_KEY}).status_code == 200
    for path in ("/v1/models", "/stats"):
        answer = httpx.get(keyed.url + path)
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
    missing = httpx.post(keyed.url + "/v1/completions", json={"model": "tiny", "prompt": "hi"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    assert httpx.get(keyed.url + "/healthz").status_code == 200  # health stays open for probes
    assert NODE_KEY not in keyed.log_path.read_text()


def test_a_node_without_a_key_needs_no_header(nodes: tuple[EngineNode, EngineNode]) -> None:
    """As vLLM without ``--api-key``: a gateway deployment with no ``api_key`` reaches it."""
    _, unkeyed = nodes
    answer = httpx.post(unkeyed.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(unkeyed.url + "/v1/models", headers={"authorization": "Bearer anything"}).status_code == 200
