"""Which deployment and which group a request gets: weights of any size, the most specific wildcard,
names that only look like patterns, and a reload that changes weights alone."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from backends.base import Backend
from backends.factory import build_backend
from gateway.routing.deployment import Deployment
from gateway.routing.router import ModelGroup, Router
from gateway.settings import DeploymentConfig, ModelGroupConfig, parse_settings

PICKS = 6000


def _shares(weights: list[float], seed: int = 7) -> list[float]:
    configs = [DeploymentConfig(provider="openai", model=f"m{i}", weight=w) for i, w in enumerate(weights)]
    deployments = [Deployment(c, object()) for c in configs]  # type: ignore[arg-type]
    group = ModelGroup(ModelGroupConfig(name="g", deployments=configs), deployments, rng=random.Random(seed))
    counts = Counter(group.pick().id for _ in range(PICKS))  # type: ignore[union-attr]
    return [counts[c.id] / PICKS for c in configs]


@pytest.mark.parametrize("weights", [[1e-6, 2e-6], [0.001, 0.003], [0.0001, 0.0001], [0.25, 0.75], [1e6, 3e6]])
def test_weighted_shares_follow_the_weights_whatever_their_scale(weights: list[float]) -> None:
    """Only the ratio counts: tiny weights once underflowed to ties that the first listed always won."""
    expected = [w / sum(weights) for w in weights]
    for share, want in zip(_shares(weights), expected, strict=True):
        assert abs(share - want) < 0.05  # about 8 standard deviations at 6000 picks


def test_one_huge_weight_takes_nearly_every_pick() -> None:
    shares = _shares([1e6, 1.0])
    assert shares[0] > 0.99


def _router(*models: tuple[str, list[str]]) -> Router:
    settings = parse_settings({"models": [
        {"name": name, "aliases": aliases, "deployments": [{"provider": "openai", "model": name}]}
        for name, aliases in models]}, env={})
    return Router.from_settings(settings, build_backend)


def _resolved(router: Router, name: str) -> str | None:
    group = router.resolve(name)
    return None if group is None else group.name


def test_the_most_specific_wildcard_wins_whatever_the_config_order() -> None:
    router = _router(("broad", ["gpt-*"]), ("narrow", ["gpt-4o-*"]), ("exact", ["gpt-4o-mini"]))
    assert _resolved(router, "gpt-4o-mini") == "exact"
    assert _resolved(router, "gpt-4o-2024-08-06") == "narrow"
    assert _resolved(router, "gpt-4.1") == "broad"
    assert _resolved(router, "GPT-4o-mini") is None  # names are case-sensitive, as OpenAI's


def test_equally_specific_wildcards_go_to_the_first_listed() -> None:
    router = _router(("first", ["a-*"]), ("second", ["*-b"]))
    assert _resolved(router, "a-b") == "first"
    assert _resolved(router, "x-b") == "second"


def test_question_marks_and_brackets_are_plain_characters_in_names() -> None:
    """Only ``*`` is a wildcard (README): ``model[beta]`` names itself, not ``modelb``."""
    router = _router(("bracketed", ["model[beta]"]), ("asked", ["what?"]))
    assert _resolved(router, "model[beta]") == "bracketed" and _resolved(router, "modelb") is None
    assert _resolved(router, "what?") == "asked" and _resolved(router, "whatX") is None


async def test_a_reload_changing_only_weights_keeps_the_backends_and_their_in_flight_counts() -> None:
    """A new weight (or tokens_per_minute) is the router's alone: the deployment keeps its backend, so
    ``least_busy`` and ``max_concurrency`` still see the requests in flight on it, and a local engine
    is not loaded again; the new weight and strategy apply at once."""
    built: list[str] = []

    def build(config: DeploymentConfig) -> Backend:
        built.append(config.id)
        return build_backend(config)

    def settings(weight: float, strategy: str) -> dict[str, object]:
        return {"models": [{"name": "a", "strategy": strategy, "deployments": [
            {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1", "weight": weight},
            {"provider": "openai", "model": "y", "api_base": "http://127.0.0.1:1/v1", "tokens_per_minute": 10}]}]}

    router = Router.from_settings(parse_settings(settings(1.0, "weighted"), env={}), build)
    before = list(router.deployments())
    before[0].backend.http.in_flight = 3  # type: ignore[attr-defined]  # as three requests would hold it
    changed = settings(5.0, "least_busy")
    changed["models"][0]["deployments"][1]["tokens_per_minute"] = 20  # type: ignore[index]
    await router.reload(parse_settings(changed, env={}), build)
    after = list(router.deployments())
    assert built == ["openai:x", "openai:y"]
    assert after == before and not any(d.retired for d in after)
    assert after[0].config.weight == 5.0 and after[0].backend.stats().in_flight == 3
    assert after[1].health.tokens_per_minute == 20
    assert router.groups[0].pick().id == "openai:y"  # type: ignore[union-attr]  # least_busy: the idle one
    before[0].backend.http.in_flight = 0  # type: ignore[attr-defined]
    await router.aclose()
