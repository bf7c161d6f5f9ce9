"""Router units: names, aliases and wildcards, strategies, circuit breaker, provider registry errors."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from backends.base import Backend, BackendStats, Unavailable
from backends.factory import build_backend
from backends.openai_http import OpenAIHTTPBackend
from backends.providers import register_provider
from gateway.routing.deployment import Deployment
from gateway.routing.health import DeploymentHealth
from gateway.routing.plan import RoutePlan
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import least_busy, priority, weighted
from gateway.settings import CircuitConfig, ConfigError, DeploymentConfig, ModelGroupConfig, parse_settings


def _group(weights: list[float], seed: int = 0) -> ModelGroup:
    deployments = [DeploymentConfig(provider="openai", model=f"m{i}", weight=w) for i, w in enumerate(weights)]
    config = ModelGroupConfig(name="g", aliases=["g-alias"], deployments=deployments)
    return ModelGroup(config, [Deployment(d, object()) for d in deployments], rng=random.Random(seed))  # type: ignore[arg-type]


def test_pick_follows_weights() -> None:
    group = _group([3.0, 1.0])
    counts = Counter(group.pick().id for _ in range(4000))  # type: ignore[union-attr]
    assert counts["openai:m0"] > 2 * counts["openai:m1"] > 0


def test_resolve_names_and_aliases() -> None:
    router = Router([_group([1.0])])
    assert router.resolve("g") is router.resolve("g-alias") is router.groups[0]
    assert router.resolve("G") is None


def test_router_from_settings_builds_openai_backends() -> None:
    settings = parse_settings({"models": [{"name": "a", "deployments": [
        {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}]}]}, env={})
    router = Router.from_settings(settings, build_backend)
    assert isinstance(router.groups[0].deployments[0].backend, OpenAIHTTPBackend)


def test_missing_provider_module_is_a_config_error() -> None:
    register_provider("openai", "backends.not_written_yet:Backend")
    try:
        with pytest.raises(ConfigError, match="not available"):
            build_backend(DeploymentConfig(provider="openai", model="x"))
    finally:
        register_provider("openai", "backends.openai_http:OpenAIHTTPBackend")


def test_unknown_fallback_is_a_config_error_naming_the_key() -> None:
    """Found when the file is read (``switchyard serve --workers N`` checks it before any worker starts)."""
    with pytest.raises(ConfigError, match=r"models\[0\]\.fallbacks\[0\]: unknown model 'zzz'"):
        parse_settings({"models": [{"name": "a", "fallbacks": ["zzz"], "deployments": [
            {"provider": "openai", "model": "x"}]}]}, env={})


async def test_a_reload_that_fails_part_way_keeps_the_table_and_closes_what_it_built(tmp_path: Path) -> None:
    closed: list[str] = []

    def build(config: DeploymentConfig) -> Backend:
        backend = build_backend(config)
        close = backend.aclose

        async def aclose() -> None:
            closed.append(config.id)
            await close()

        backend.aclose = aclose  # type: ignore[method-assign]
        return backend

    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}
    router = Router.from_settings(parse_settings({"models": [{"name": "a", "deployments": [dep]}]}, env={}), build)
    broken = parse_settings({"models": [{"name": "a", "deployments": [
        dep, dep | {"name": "new"}, dep | {"name": "bad", "tokenizer": str(tmp_path / "missing")}]}]}, env={})
    with pytest.raises(ConfigError, match=r"deployments\[2\]\.tokenizer"):
        await router.reload(broken, build)
    await asyncio.sleep(0.05)
    assert [d.id for d in router.deployments()] == ["openai:x"] and sorted(closed) == ["bad", "new"]
    await router.aclose()


async def test_closing_the_router_closes_a_removed_deployment_still_serving() -> None:
    """A reload removed a deployment with a request in flight; the gateway shuts down before it
    ends: its backend is closed with the others, not left open."""
    closed: list[str] = []

    def build(config: DeploymentConfig) -> Backend:
        backend = build_backend(config)
        close = backend.aclose

        async def aclose() -> None:
            closed.append(config.id)
            await close()

        backend.aclose = aclose  # type: ignore[method-assign]
        return backend

    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}
    router = Router.from_settings(parse_settings({"models": [{"name": "a", "deployments": [
        dep | {"name": "old"}]}]}, env={}), build)
    old = next(router.deployments())
    assert isinstance(old.backend, OpenAIHTTPBackend)
    old.backend.http.in_flight = 1  # a stream there is still open
    await router.reload(parse_settings({"models": [{"name": "a", "deployments": [dep | {"name": "new"}]}]},
                                       env={}), build)
    await asyncio.sleep(0.05)
    assert closed == []  # it waits for its stream
    await router.aclose()
    assert sorted(closed) == ["new", "old"]


async def test_a_plan_made_before_a_reload_never_tries_a_deployment_it_removed() -> None:
    """A request waiting out a retry's backoff holds the old table: once a reload removes a
    deployment (its backend closes when idle), the plan passes it over for the others or fallbacks."""
    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}
    settings = {"models": [{"name": "a", "deployments": [dep | {"name": "old"}, dep | {"name": "kept"}]}]}
    router = Router.from_settings(parse_settings(settings, env={}), build_backend)
    before = router.resolve("a")
    assert before is not None
    await router.reload(parse_settings({"models": [{"name": "a", "deployments": [dep | {"name": "kept"}]}]}, env={}),
                        build_backend)
    old = next(d for d in before.deployments if d.id == "old")
    assert old.retired and not any(d.retired for d in router.deployments())
    plan, tried = RoutePlan(before, router.resolve), list[str]()
    attempt = plan.first()
    while attempt is not None and len(tried) < 6:  # the first attempt, then each retry after a failure
        tried.append(attempt.deployment.id)
        attempt = plan.after(Unavailable("down"))
    assert tried and set(tried) == {"kept"}
    await router.aclose()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_circuit_breaker_state_machine() -> None:
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=3, window=10, cooldown=5), clock=clock)
    for t in (0.0, 1.0):
        clock.now = t
        health.on_failure()
    clock.now = 20.0  # the first two fell out of the window
    health.on_failure()
    assert health.state == "closed" and health.available()
    for t in (21.0, 22.0):
        clock.now = t
        health.on_failure()
    assert health.state == "open" and not health.available()
    clock.now = 27.5
    assert health.state == "half_open" and health.available()
    trial = health.on_attempt()
    assert not health.available()  # one trial at a time
    health.on_abandoned(trial)  # the client went away: the trial slot is free again
    assert health.available()
    health.on_attempt()
    health.on_failure()  # the trial failed: open for another cooldown
    assert health.state == "open"
    clock.now = 33.0
    health.on_attempt()
    health.on_success(0.2)
    assert health.state == "closed" and health.view().state == "healthy"
    assert health.view().latency_ewma_ms == pytest.approx(200.0)


def test_a_requests_own_4xx_neither_fails_nor_heals_the_deployment() -> None:
    """Bad requests between the failures do not keep a failing deployment's circuit closed."""
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=3, window=10, cooldown=5), clock=clock)
    for t in (0.0, 1.0, 2.0):
        clock.now = t
        health.on_failure("t")
        health.on_refused(0)
    assert health.state == "open"
    clock.now = 7.5
    health.on_refused(health.on_attempt())  # a half-open trial refused as the request's fault: the next one tries
    assert health.state == "half_open" and health.available()


def test_only_the_trial_itself_frees_the_half_open_trial_slot() -> None:
    """A request sent before the circuit opened, ending without a verdict (its own 4xx, its client
    gone) while the half-open trial is in flight, does not let a second trial through."""
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=1, window=10, cooldown=5), clock=clock)
    straggler, other = health.on_attempt(), health.on_attempt()
    assert straggler == other == 0  # the circuit is closed: no trial
    health.on_failure()
    clock.now = 6.0
    trial = health.on_attempt()
    assert trial and not health.available()
    health.on_refused(straggler)
    health.on_abandoned(other)
    assert not health.available()  # still the one trial in flight
    health.on_abandoned(trial)
    assert health.available()


def test_one_tenants_failures_open_its_own_circuit_while_others_are_served() -> None:
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=3, window=10, cooldown=5), clock=clock)
    health.on_success(0.1, "good")
    for t in (1.0, 2.0, 3.0):
        clock.now = t
        health.on_failure("flooder")
    assert health.state == "closed" and health.available()  # the deployment stays up for everyone
    assert not health.admits("flooder") and health.admits("good")
    assert health.tenant_retry_after("flooder") == pytest.approx(5.0)
    clock.now = 8.5
    assert health.admits("flooder")  # its cooldown is over
    for t, who in ((9.0, "flooder"), (9.5, "other"), (10.0, "flooder")):  # failures of several tenants
        clock.now = t
        health.on_failure(who)
    assert health.state == "open"


def test_a_lone_tenants_failures_open_the_deployments_circuit() -> None:
    health = DeploymentHealth(CircuitConfig(failures=2, window=10, cooldown=5), clock=_Clock())
    health.on_failure("only")
    health.on_failure("only")  # nobody else was served: the deployment itself is suspect
    assert health.state == "open" and health.admits("only")


def test_a_hold_off_refuses_requests_until_it_ends_whatever_the_circuit() -> None:
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=5, window=10, cooldown=5), clock=clock)
    health.hold_off(30.0)
    health.hold_off(10.0)  # a shorter wait asked later does not shorten the first
    assert health.state == "closed" and not health.available() and health.held_for() == pytest.approx(30.0)
    health.on_success(0.1)  # a straggler's success does not end it either
    clock.now = 29.0
    assert not health.available()
    clock.now = 30.0
    assert health.available() and health.held_for() == 0.0


def test_the_health_view_shows_a_hold_off_apart_from_the_circuit() -> None:
    """A held deployment takes no request, not even a half-open trial: its view says "held" and for
    how long, unless its circuit is open (then "open", with the hold's seconds beside it)."""
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(failures=1, window=10, cooldown=5), clock=clock)
    health.hold_off(30.0)
    clock.now = 10.0
    assert (health.view().state, health.view().held_for_seconds) == ("held", pytest.approx(20.0))
    health.on_failure()
    assert (health.view().state, health.view().held_for_seconds) == ("open", pytest.approx(20.0))
    clock.now = 16.0  # the cooldown is over: half-open, but no trial while held
    assert health.state == "half_open" and health.view().state == "held"
    clock.now = 30.0
    assert (health.view().state, health.view().held_for_seconds) == ("cooling", 0.0)


def test_tokens_per_minute_window() -> None:
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(), clock=clock, tokens_per_minute=100)
    health.record_tokens(60)
    clock.now = 30
    health.record_tokens(50)
    assert not health.within_tpm()
    clock.now = 61  # the first 60 expired
    assert health.within_tpm() and health.tokens_last_minute() == 50


def test_tokens_in_flight_count_against_tokens_per_minute_until_released() -> None:
    clock = _Clock()
    health = DeploymentHealth(CircuitConfig(), clock=clock, tokens_per_minute=100)
    reserved = health.reserve_tokens(100)
    assert reserved == 100 and not health.within_tpm()
    health.release_tokens(reserved)
    health.release_tokens(reserved)  # released twice: never below nothing
    assert health.within_tpm() and health.reserve_tokens(99) == 99 and health.within_tpm()
    assert DeploymentHealth(CircuitConfig()).reserve_tokens(10) == 0  # no limit: nothing counted


def test_wildcard_aliases() -> None:
    settings = parse_settings({"models": [
        {"name": "exact", "aliases": ["gpt-4o-mini"], "deployments": [{"provider": "openai", "model": "x"}]},
        {"name": "family", "aliases": ["gpt-4o-*"], "deployments": [{"provider": "openai", "model": "y"}]},
    ]}, env={})
    router = Router.from_settings(settings, build_backend)
    assert router.resolve("gpt-4o-mini").name == "exact"  # type: ignore[union-attr]  # exact names win
    assert router.resolve("gpt-4o-2024-08-06").name == "family"  # type: ignore[union-attr]
    assert router.resolve("gpt-5") is None


class _Loaded:
    """Just enough of a Backend for the strategies: its load figures."""

    def __init__(self, in_flight: int = 0, queue_depth: int = 0, kv: float | None = None) -> None:
        self._stats = BackendStats(in_flight=in_flight, queue_depth=queue_depth, kv_cache_usage=kv)

    def stats(self) -> BackendStats:
        return self._stats


def test_least_busy_uses_queue_depth_and_kv_usage() -> None:
    configs = [DeploymentConfig(provider="local", model=f"m{i}") for i in range(3)]
    loads = [_Loaded(in_flight=4, queue_depth=3), _Loaded(in_flight=4, kv=0.9), _Loaded(in_flight=4, kv=0.2)]
    deployments = [Deployment(c, b) for c, b in zip(configs, loads, strict=True)]  # type: ignore[arg-type]
    ordered = least_busy(deployments, random.Random(0))
    assert [d.config.model for d in ordered] == ["m2", "m1", "m0"]


def test_least_busy_counts_a_queued_request_once() -> None:
    """``queue_depth`` is part of ``in_flight`` (BackendStats): 3 outstanding, 1 of them queued, is
    less busy than 4 outstanding, whatever the KV caches say."""
    configs = [DeploymentConfig(provider="local", model=f"m{i}") for i in range(2)]
    loads = [_Loaded(in_flight=4, kv=0.1), _Loaded(in_flight=3, queue_depth=1, kv=0.5)]
    deployments = [Deployment(c, b) for c, b in zip(configs, loads, strict=True)]  # type: ignore[arg-type]
    assert [d.config.model for d in least_busy(deployments, random.Random(0))] == ["m1", "m0"]


def test_priority_keeps_the_configured_order_and_weighted_orders_everyone() -> None:
    configs = [DeploymentConfig(provider="openai", model=f"m{i}", weight=w) for i, w in enumerate([1, 100, 1])]
    deployments = [Deployment(c, _Loaded()) for c in configs]  # type: ignore[arg-type]
    assert [d.config.model for d in priority(deployments, random.Random(0))] == ["m0", "m1", "m2"]
    order = weighted(deployments, random.Random(0))
    assert sorted(d.config.model for d in order) == ["m0", "m1", "m2"] and order[0].config.model == "m1"


async def test_a_reload_changing_only_the_circuit_keeps_the_backend() -> None:
    """A deployment whose own config is unchanged keeps its backend (a local engine is not loaded a
    second time beside the first) when only its group's circuit settings change; they apply to it."""
    built: list[str] = []

    def build(config: DeploymentConfig) -> Backend:
        built.append(config.id)
        return build_backend(config)

    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}
    router = Router.from_settings(parse_settings({"models": [{"name": "a", "deployments": [dep]}]}, env={}), build)
    before = next(router.deployments())
    await router.reload(parse_settings({"models": [{"name": "a", "circuit": {"failures": 1}, "deployments": [dep]}]},
                                       env={}), build)
    after = next(router.deployments())
    assert built == ["openai:x"] and after is before and not after.retired
    assert after.health.config.failures == 1
    await router.aclose()


async def test_a_plan_made_before_a_reload_goes_on_to_the_deployment_that_replaced_one() -> None:
    """A reload that changes a group's only deployment (a new ``api_base``) while a request waits
    out a retry's backoff: the retry goes to the deployment as it is now, not nowhere."""
    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1", "name": "d"}
    router = Router.from_settings(parse_settings({"models": [{"name": "a", "deployments": [dep]}]}, env={}),
                                  build_backend)
    before = router.resolve("a")
    assert before is not None
    plan = RoutePlan(before, router.resolve)
    first = plan.first()
    assert first is not None
    moved = dep | {"api_base": "http://127.0.0.1:2/v1"}
    await router.reload(parse_settings({"models": [{"name": "a", "deployments": [moved]}]}, env={}), build_backend)
    retry = plan.after(Unavailable("down"))
    assert retry is not None and not retry.deployment.retired
    assert retry.deployment.config.api_base == "http://127.0.0.1:2/v1"
    await router.aclose()


async def test_fallbacks_chain_depth_first_and_enter_each_group_once() -> None:
    """a -> [b, d], b -> [c], c -> [a, b]: b's own fallback before a's next one, and the cycle back
    to a and b is passed over."""
    dep = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}
    fallbacks = {"a": ["b", "d"], "b": ["c"], "c": ["a", "b"], "d": []}
    settings = parse_settings({"models": [
        {"name": name, "max_retries": 0, "fallbacks": names, "deployments": [dep | {"name": f"{name}-1"}]}
        for name, names in fallbacks.items()]}, env={})
    router = Router.from_settings(settings, build_backend)
    start = router.resolve("a")
    assert start is not None
    plan, tried = RoutePlan(start, router.resolve), list[str]()
    attempt = plan.first()
    while attempt is not None and len(tried) < 10:
        tried.append(attempt.group.name)
        attempt = plan.after(Unavailable("down"))
    assert tried == ["a", "b", "c", "d"]
    await router.aclose()
