"""Engine nodes under faults: a client that leaves, a node killed mid-stream.

Two ``switchyard engine serve`` processes (the built-in tiny model) behind a gateway that lists
them as ``provider: openai`` deployments in priority order; the last test kills the first node.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.factory import build_backend
from engine.tiny_model import build_tiny_model
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.engine_nodes import EngineNode
from tests.support.servers import ServerThread

KEY = "sk-node-faults"
NODE_KEY = "sk-node-faults-internal"
BLOCKS = 512
LONG = 2000  # output tokens (ignore_eos): a request still generating when the test acts


class Stack:
    def __init__(self, nodes: list[EngineNode], router: Router, usage: RecordingSink, url: str) -> None:
        self.nodes, self.router, self.usage, self.url = nodes, router, usage, url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    model = build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=5)
    workdir = tmp_path_factory.mktemp("nodes")
    nodes = [EngineNode(model, workdir, f"node{i}", "--num-kv-blocks", str(BLOCKS), api_key=NODE_KEY)
             for i in range(2)]
    deployments = [{"provider": "openai", "name": n.name, "model": "tiny", "api_base": n.url + "/v1",
                    "api_key": NODE_KEY} for n in nodes]
    settings = parse_settings({"models": [
        {"name": "tiny", "strategy": "priority", "max_retries": 1, "deployments": deployments},
        {"name": "second", "max_retries": 0, "deployments": [dict(deployments[1], name="second")]},
    ]}, env={})
    router = Router.from_settings(settings, build_backend)
    usage = RecordingSink()
    services = Services(authenticator=StaticKeys({KEY: Principal(key_id="k", tenant_id="t")}),
                        admission=ScriptedAdmission(), usage=usage, router=router)
    from gateway.app import create_app

    try:
        for n in nodes:
            n.launch()
        for n in nodes:
            n.wait_ready()
        with ServerThread(create_app(settings, services)) as server:
            yield Stack(nodes, router, usage, server.url)
    finally:
        for n in nodes:
            n.stop()


def _body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG, "ignore_eos": True,
            **extra}


def _settled(node: EngineNode) -> dict[str, Any]:
    """The node's /stats once it runs nothing (within 30 s)."""
    deadline = time.monotonic() + 30
    while (stats := node.stats())["num_running"] or stats["queue_depth"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    return stats


def test_client_gone_before_a_whole_answer_aborts_it_on_the_node(stack: Stack) -> None:
    """A non-streaming request whose client leaves is cancelled on the node too: it stops
    generating and frees its KV blocks, not after the whole answer."""
    node = stack.nodes[1]
    before = _settled(node)["generation_tokens"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stack.url + "/v1/chat/completions", json=_body("second"),
                   headers={"authorization": f"Bearer {KEY}"}, timeout=httpx.Timeout(60, read=1.0))
    record = stack.usage.wait_for(1)[-1]
    assert (record.status, record.error_type) == (499, "client_disconnected")
    after = _settled(node)
    assert after["generation_tokens"] - before < LONG  # aborted, not run to its end
    assert after["num_free_blocks"] == BLOCKS


def test_node_killed_mid_stream(stack: Stack) -> None:
    """The client gets an error event in OpenAI's shape at once; the usage row counts what was sent;
    the deployment's slot is freed and the failure counted; the next request goes to the other node."""
    headers = {"authorization": f"Bearer {KEY}"}
    events: list[str] = []
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=_body("tiny", stream=True), headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 10:
                    assert stack.nodes[0].proc is not None
                    stack.nodes[0].proc.send_signal(signal.SIGKILL)
    assert '"code":"upstream_unavailable"' in events[-1] and events[-1].startswith('{"error":{')
    record = stack.usage.wait_for(2)[-1]
    assert record.deployment == "node0" and record.stream and record.completion_tokens >= 9
    first = stack.router.groups[0].deployments[0]
    assert first.backend.stats().in_flight == 0 and first.health.errors == 1
    answer = httpx.post(stack.url + "/v1/chat/completions", json=_body("tiny", max_tokens=3), headers=headers,
                        timeout=30)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    assert stack.usage.wait_for(3)[-1].deployment == "node1"
