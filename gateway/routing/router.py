"""Public model names -> model groups -> deployments -> Backends.

``Router.resolve(name)`` finds the group for a public name or alias (``*`` wildcards allowed in
aliases, e.g. ``gpt-4o-*``: an exact name wins, then the most specific pattern, the one with the
most characters besides its ``*``s, then the one listed first; ``?`` and ``[`` are plain
characters); ``gateway.routing.plan.RoutePlan`` gives the attempts for one request (strategy order,
retries, fallbacks). ``reload(settings)`` swaps the routing table in place, the new backends built
off the event loop: unchanged deployments (or ones with a new ``weight`` or ``tokens_per_minute``
alone) keep their backend and health, changed ones that call the same upstream keep their health
(circuit, hold-offs, token window), removed ones are closed once idle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import msgspec

from backends.base import Backend
from backends.prompt_count import PromptCounter
from gateway.routing.deployment import Deployment
from gateway.routing.health import DeploymentHealth
from gateway.routing.strategies import STRATEGIES
from gateway.settings import CircuitConfig, ConfigError, DeploymentConfig, ModelGroupConfig, Settings

log = logging.getLogger("switchyard.router")

BackendBuilder = Callable[[DeploymentConfig], Backend]
RETIRE_GRACE_SECONDS = 600.0  # the longest a removed deployment waits for in-flight requests
ROUTER_ONLY = ("weight", "tokens_per_minute")  # deployment settings no backend reads


class ModelGroup:
    """One public model: its names and the deployments serving it."""

    def __init__(
        self, config: ModelGroupConfig, deployments: list[Deployment], rng: random.Random | None = None
    ) -> None:
        if not deployments:
            raise ValueError(f"model {config.name!r} has no deployments")
        self.config = config
        self.deployments = deployments
        self.rng = rng or random.Random()
        self._strategy = STRATEGIES[config.strategy]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.config.name, *self.config.aliases)

    def ordered(self, routing_key: str | None = None) -> list[Deployment]:
        """The deployments that may take a request now (circuit closed or trial allowed, below
        ``max_concurrency`` and ``tokens_per_minute``), best first by the group's strategy
        (``routing_key``: the prompt's opening, for ``cache_aware``)."""
        return self._strategy([d for d in self.deployments if d.accepts()], self.rng, routing_key)

    def pick(self, routing_key: str | None = None) -> Deployment | None:
        ordered = self.ordered(routing_key)
        return ordered[0] if ordered else None


class Router:
    def __init__(self, groups: list[ModelGroup]) -> None:
        self._retiring: set[asyncio.Task[None]] = set()
        self._reloading = asyncio.Lock()
        self._install(groups)

    def _install(self, groups: list[ModelGroup]) -> None:
        self.groups = groups
        self._by_name: dict[str, ModelGroup] = {}
        patterns: list[tuple[str, ModelGroup]] = []
        for group in groups:
            for name in group.names:
                if is_wildcard(name):
                    patterns.append((name, group))
                else:
                    self._by_name[name] = group
        # the most specific first (a stable sort: ties in the config's order), so `gpt-*` listed
        # before `gpt-4o-*` does not take every `gpt-4o-...` name
        patterns.sort(key=lambda p: len(p[0]) - p[0].count("*"), reverse=True)
        self._patterns = [(_wildcard(name), group) for name, group in patterns]

    @classmethod
    def from_settings(cls, settings: Settings, build: BackendBuilder) -> Router:
        groups, _ = _build_groups(settings, build, {})  # nothing reused, nothing carried
        return cls(groups)

    def resolve(self, name: str) -> ModelGroup | None:
        group = self._by_name.get(name)
        if group is None:
            group = next((g for pattern, g in self._patterns if pattern.fullmatch(name)), None)
        return group

    def deployments(self) -> Iterator[Deployment]:
        for group in self.groups:
            yield from group.deployments

    async def reload(self, settings: Settings, build: BackendBuilder) -> None:
        """Swap in a new routing table; requests already routed keep their deployment. The new
        backends are built in a worker thread, as a local engine loads its weights for seconds:
        the loop keeps serving meanwhile, and the table changes in one step on the loop once all
        are built. A config error part way leaves the table as it was and closes the backends
        built for it. Reloads run one at a time. Not to be cancelled (the build runs on in its
        thread): a caller that may be shields it."""
        async with self._reloading:
            current = {(g.name, d.id): d for g in self.groups for d in g.deployments}
            built: list[Backend] = []

            def build_new(config: DeploymentConfig) -> Backend:
                built.append(build(config))
                return built[-1]

            try:
                groups, carried = await asyncio.to_thread(_build_groups, settings, build_new, current)
            except BaseException:
                for backend in built:  # e.g. a local engine loaded before a later deployment failed
                    self._in_background(backend.aclose())
                raise
            for apply in carried:  # on the loop, once all is built
                apply()
            kept = {id(d) for g in groups for d in g.deployments}
            self._install(groups)
            for deployment in current.values():
                if id(deployment) not in kept:
                    deployment.retired = True  # a request waiting out a backoff must not try it once it closes
                    self._in_background(_retire(deployment))
        log.info("routing table reloaded: %d models", len(groups))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def ready(self, groups: list[ModelGroup] | None = None) -> dict[Deployment, bool]:
        """Readiness of every deployment of ``groups`` (default: the table now), checked concurrently;
        by the deployment, not its id: unnamed ones of the same provider and model in two groups
        share an id, not an upstream."""
        deployments = [d for g in (self.groups if groups is None else groups) for d in g.deployments]
        results = await asyncio.gather(*(_ready(d.backend) for d in deployments))
        return dict(zip(deployments, results, strict=True))

    async def aclose(self) -> None:
        """Close every backend, those of removed deployments still waiting for their requests too."""
        retiring = list(self._retiring)
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, *(d.backend.aclose() for d in self.deployments()), return_exceptions=True)


def is_wildcard(name: str) -> bool:
    """Whether a configured name is a pattern (``gpt-4o-*``) rather than a model name."""
    return "*" in name


def _wildcard(name: str) -> re.Pattern[str]:
    """``name`` as a pattern in which ``*`` matches any characters and every other one itself."""
    return re.compile(".*".join(re.escape(part) for part in name.split("*")), re.DOTALL)


def _counter(dep: DeploymentConfig, where: str) -> PromptCounter | None:
    if dep.tokenizer is None:
        return None
    try:
        return PromptCounter.load(dep.tokenizer)
    except Exception as exc:
        raise ConfigError(f"config error at {where}.tokenizer: cannot load {dep.tokenizer!r} ({exc})") from None


Carried = list[Callable[[], None]]  # what kept deployments take of the new settings, applied on the loop


def _build_groups(
    settings: Settings, build: BackendBuilder, reuse: dict[tuple[str, str], Deployment]
) -> tuple[list[ModelGroup], Carried]:
    """The groups for ``settings``, reusing ``reuse``'s deployments where only what the router reads
    changed, and what the kept ones take of the new settings once the whole table is built (a config
    error changes nothing). Touches nothing the loop uses: it may run in a worker thread."""
    groups = []
    carried: Carried = []
    for i, config in enumerate(settings.models):
        deployments = []
        for j, dep in enumerate(config.deployments):
            old = reuse.get((config.name, dep.id))
            if old is not None and _same_backend(old.config, dep):  # its backend and in-flight count stay
                if old.config != dep or old.health.config != config.circuit:
                    carried.append(functools.partial(_retune, old, dep, config.circuit))
                deployments.append(old)
                continue
            if old is not None and _same_upstream(old.config, dep):  # its circuit, holds and token window stay
                health = old.health
                carried.append(functools.partial(health.reconfigure, config.circuit, dep.tokens_per_minute))
            else:
                health = DeploymentHealth(config.circuit, tokens_per_minute=dep.tokens_per_minute)
            deployments.append(Deployment(dep, build(dep), health, _counter(dep, f"models[{i}].deployments[{j}]")))
        groups.append(ModelGroup(config, deployments))
    return groups, carried


def _same_backend(old: DeploymentConfig, new: DeploymentConfig) -> bool:
    """Whether ``new`` differs from ``old`` at most in what the router alone reads (``ROUTER_ONLY``):
    a new weight must not rebuild the backend (load a local model again, lose its in-flight count)."""
    return old == new or msgspec.structs.replace(new, **{f: getattr(old, f) for f in ROUTER_ONLY}) == old


def _retune(deployment: Deployment, config: DeploymentConfig, circuit: CircuitConfig) -> None:
    deployment.config = config
    deployment.health.reconfigure(circuit, config.tokens_per_minute)


def _same_upstream(old: DeploymentConfig, new: DeploymentConfig) -> bool:
    """Whether a changed deployment still calls the same upstream model with the same credentials."""
    return (old.provider, old.model, old.api_base, old.api_key) == (new.provider, new.model, new.api_base, new.api_key)


async def _retire(deployment: Deployment) -> None:
    """Close a removed deployment's backend once its in-flight requests are done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETIRE_GRACE_SECONDS
    try:
        while deployment.backend.stats().in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.5)
    finally:  # the router closing (shutdown) cancels the wait, not the close
        await deployment.backend.aclose()


async def _ready(backend: Backend, timeout: float = 5.0) -> bool:
    try:
        async with asyncio.timeout(timeout):
            return bool(await backend.ready())
    except Exception:
        return False
