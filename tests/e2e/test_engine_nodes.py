"""Engine as a service: two ``switchyard engine serve`` processes behind a gateway.

The nodes serve the built-in tiny model over OpenAI-compatible HTTP; the gateway reaches them with
``provider: openai`` deployments under ``strategy: cache_aware``. A multi-turn conversation keeps
hitting one node's prefix cache (as the nodes' /stats report), independent conversations spread.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engine.tiny_model import build_tiny_model
from gateway.contracts import Principal
from gateway.settings import parse_settings
from tests.support.engine_nodes import EngineNode
from tests.support.scripted_gateway import scripted_gateway

KEY2 = "sk-test-nodes-tenant-2"
KEY = "sk-nodes-test"
NODE_KEY = "sk-node-internal"
SYSTEM = ("You are the help desk of a small bicycle shop in a hilly town. You answer questions about "
          "repairs, opening hours and spare parts, briefly and politely, and you never invent prices. ")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=5)


@pytest.fixture(scope="module")
def nodes(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineNode]]:
    """Two nodes; the second one runs with ``--tensor-parallel-size 2`` (two rank processes), so the
    tensor-parallel path serves the gateway tests too and needs no start-up of its own."""
    workdir = tmp_path_factory.mktemp("nodes")
    procs = [EngineNode(model, workdir, f"node{i}", "--num-kv-blocks", "512", "--scheduling", "fair",
                        *(["--tensor-parallel-size", "2"] if i == 1 else []), api_key=NODE_KEY) for i in range(2)]
    try:
        for p in procs:
            p.launch()
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()
    for p in procs:  # a clean run and a clean shutdown, the tensor-parallel ranks included
        assert "Traceback" not in p.log_path.read_text(), p.log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def gateway(nodes: list[EngineNode]) -> Iterator[str]:
    deployments = [{"provider": "openai", "name": n.name, "model": "tiny", "api_base": n.url + "/v1",
                    "api_key": NODE_KEY, "options": {"forward_tenant": True}} for n in nodes]
    settings = parse_settings({"models": [{"name": "tiny", "strategy": "cache_aware", "deployments": deployments}]},
                              env={})
    keys = {KEY: Principal(key_id="k", tenant_id="t"), KEY2: Principal(key_id="k2", tenant_id="t2", tenant_weight=2.0)}
    with scripted_gateway(settings, keys) as server:
        yield server.url


def _prompt_tokens(nodes: list[EngineNode]) -> list[tuple[int, int]]:
    """(prompt tokens looked up, of which cache hits) per node."""
    return [(s["prefix_cache"]["queries"], s["prefix_cache"]["hits"]) for s in (n.stats() for n in nodes)]


def test_node_serves_the_openai_surface_and_stats(nodes: list[EngineNode]) -> None:
    node = nodes[0]
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=NODE_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    chunks = list(client.completions.create(model="tiny", prompt="Once upon", max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=-1)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=node.url + "/v1", api_key="wrong", max_retries=0).models.list()
    stats = httpx.get(node.url + "/stats", headers={"authorization": f"Bearer {NODE_KEY}"}).json()
    assert stats["queue_depth"] == 0 and 0.0 <= stats["kv_usage"] <= 1.0 and stats["num_kv_blocks"] == 512
    assert stats["prefix_cache"]["cached_blocks"] >= 1 and stats["prefix_cache"]["root_hashes"]
    assert httpx.get(node.url + "/stats").status_code == 401


def test_conversation_sticks_to_one_node_and_hits_its_cache(gateway: str, nodes: list[EngineNode]) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0)
    before = _prompt_tokens(nodes)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "When do you open on Sundays?"}]
    for turn in range(4):
        answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": answer.choices[0].message.content or ""},
                     {"role": "user", "content": f"And question number {turn}?"}]
    after = _prompt_tokens(nodes)
    looked = [a[0] - b[0] for a, b in zip(after, before)]
    hits = [a[1] - b[1] for a, b in zip(after, before)]
    home = looked.index(max(looked))
    assert looked[1 - home] == 0  # every turn went to one node
    assert hits[home] >= 3 * 16  # turns 2..4 found at least the system prompt's blocks cached


def test_independent_conversations_spread_over_both_nodes(gateway: str, nodes: list[EngineNode]) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0)
    before = _prompt_tokens(nodes)
    for i in range(10):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "system", "content": f"Customer {i}. " + SYSTEM}, {"role": "user", "content": "Hello"}])
    after = _prompt_tokens(nodes)
    assert all(a[0] > b[0] for a, b in zip(after, before))


def test_tensor_parallel_node_answers_like_a_single_rank_node(nodes: list[EngineNode]) -> None:
    request: dict[str, Any] = {"model": "tiny", "max_tokens": 12, "temperature": 0,
                               "messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": "Can you fix a flat tyre today?"}]}
    single = openai.OpenAI(base_url=nodes[0].url + "/v1", api_key=NODE_KEY, max_retries=0)
    split = openai.OpenAI(base_url=nodes[1].url + "/v1", api_key=NODE_KEY, max_retries=0)  # tensor-parallel
    want = single.chat.completions.create(**request)
    got = split.chat.completions.create(**request)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage is not None and got.usage.completion_tokens == 12
    assert "Traceback" not in nodes[1].log_path.read_text()


def test_nodes_schedule_the_tenants_the_gateway_forwards(gateway: str, nodes: list[EngineNode]) -> None:
    """``forward_tenant`` sends each request's tenant and weight to the node, whose fair scheduler
    (``--scheduling fair``) counts them apart; a direct caller with no tenant stays anonymous."""
    for key in (KEY, KEY2):
        client = openai.OpenAI(base_url=gateway + "/v1", api_key=key, max_retries=0)
        for i in range(4):
            client.chat.completions.create(model="tiny", max_tokens=2, messages=[
                {"role": "system", "content": f"Tenant check {i}. " + SYSTEM}, {"role": "user", "content": "Hi"}])
    seen: dict[str, tuple[float, int]] = {}
    for stats in (n.stats() for n in nodes):
        for t in stats["tenants"]:
            weight, tokens = seen.get(t["tenant_id"], (t["weight"], 0))
            seen[t["tenant_id"]] = (weight, tokens + t["tokens_scheduled"])
    assert set(seen) == {"t", "t2"}, seen
    assert seen["t"][0] == 1.0 and seen["t2"][0] == 2.0 and seen["t"][1] > 0 and seen["t2"][1] > 0
