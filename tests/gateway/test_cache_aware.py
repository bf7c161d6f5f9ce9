"""Strategy ``cache_aware``: stable prefix keys, consistent placement, the load cap."""

from __future__ import annotations

import random
from collections import Counter

import msgspec

from backends.base import BackendStats
from backends.openai_wire import ChatCompletionRequest
from gateway.routing.cache_aware import cache_aware, chat_prefix, prefix_key
from gateway.routing.deployment import Deployment
from gateway.routing.router import ModelGroup
from gateway.settings import DeploymentConfig, ModelGroupConfig, parse_settings

SYSTEM = "You are the support assistant of a bicycle shop. Answer briefly and politely. " * 4


class _Loaded:
    def __init__(self) -> None:
        self.in_flight = 0
        self.queue_depth = 0  # part of in_flight

    def stats(self) -> BackendStats:
        return BackendStats(in_flight=self.in_flight, queue_depth=self.queue_depth)


def _deployments(n: int) -> list[Deployment]:
    return [Deployment(DeploymentConfig(provider="openai", model="m", name=f"node{i}"), _Loaded()) for i in range(n)]  # type: ignore[arg-type]


def _first(deployments: list[Deployment], text: str) -> str:
    return cache_aware(deployments, random.Random(0), text)[0].id


def test_key_is_stable_as_a_conversation_grows() -> None:
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you repair tyres?"}]
    keys = set()
    for i in range(5):
        body = msgspec.convert({"model": "m", "messages": turns}, ChatCompletionRequest)
        keys.add(prefix_key(chat_prefix(body)))
        turns = turns + [{"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": f"question {i}"}]
    assert len(keys) == 1
    assert prefix_key("") is None and prefix_key("a") != prefix_key("b")


def test_same_prefix_same_node_and_independent_prefixes_spread() -> None:
    deployments = _deployments(3)
    assert len({_first(deployments, SYSTEM * 4 + f" turn {i}") for i in range(20)}) == 1  # same first PREFIX_CHARS
    spread = Counter(_first(deployments, f"{i} " + SYSTEM) for i in range(300))
    assert set(spread) == {"node0", "node1", "node2"} and min(spread.values()) > 50


def test_removing_a_node_moves_only_its_keys() -> None:
    three = _deployments(3)
    prompts = [f"{i} " + SYSTEM for i in range(200)]
    before = {p: _first(three, p) for p in prompts}
    after = {p: _first(three[:2], p) for p in prompts}
    moved = [p for p in prompts if before[p] != after[p]]
    assert moved and all(before[p] == "node2" for p in moved)


def test_load_cap_sends_overflow_elsewhere_in_ring_order() -> None:
    deployments = _deployments(2)
    home = _first(deployments, SYSTEM)
    busy = next(d for d in deployments if d.id == home)
    busy.backend.in_flight = 4  # type: ignore[attr-defined]
    order = cache_aware(deployments, random.Random(0), SYSTEM)
    assert [d.id for d in order][1] == home  # over the cap: tried last, not dropped
    busy.backend.in_flight = 1  # type: ignore[attr-defined]  # cap = ceil(1.25 * 2 / 2) = 2: still home
    assert _first(deployments, SYSTEM) == home
    busy.backend.queue_depth = 1  # type: ignore[attr-defined]  # the one outstanding is queued: still 1, not 2
    assert _first(deployments, SYSTEM) == home


def test_group_config_accepts_the_strategy() -> None:
    settings = parse_settings({"models": [{"name": "a", "strategy": "cache_aware", "deployments": [
        {"provider": "openai", "model": "x", "name": "n0"}, {"provider": "openai", "model": "x", "name": "n1"}]}]},
        env={})
    config: ModelGroupConfig = settings.models[0]
    group = ModelGroup(config, _deployments(2))
    assert group.pick(SYSTEM) is not None
    assert group.pick() is not None  # no prefix (e.g. an empty prompt): still a valid order
