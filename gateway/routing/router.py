"""Public model names -> model groups -> deployments -> Backends.

``Router.resolve(name)`` finds the group for a public name or alias (``*`` wildcards allowed in
aliases, e.g. ``gpt-4o-*``); ``gateway.routing.plan.RoutePlan`` gives the attempts for one request
(strategy order, retries, fallbacks). ``reload(settings)`` swaps the routing table in place, the new
backends built off the event loop: unchanged deployments keep their backend and health, changed ones
that call the same upstream keep their health (circuit, hold-offs, token window), removed ones are
closed once idle.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import random
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from backends.base import Backend
from backends.prompt_count import PromptCounter
from gateway.routing.deployment import Deployment
from gateway.routing.health import DeploymentHealth
from gateway.routing.strategies import STRATEGIES
from gateway.settings import CircuitConfig, ConfigError, DeploymentConfig, ModelGroupConfig, Settings

log = logging.getLogger("switchyard.router")

BackendBuilder = Callable[[DeploymentConfig], Backend]
RETIRE_GRACE_SECONDS = 600.0  # the longest a removed deployment waits for in-flight requests


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
        self._patterns: list[tuple[str, ModelGroup]] = []
        for group in groups:
            for name in group.names:
                if any(c in name for c in "*?["):
                    self._patterns.append((name, group))
                else:
                    self._by_name[name] = group

    @classmethod
    def from_settings(cls, settings: Settings, build: BackendBuilder) -> Router:
        groups, _ = _build_groups(settings, build, {})  # nothing reused, nothing carried
        return cls(groups)

    def resolve(self, name: str) -> ModelGroup | None:
        group = self._by_name.get(name)
        if group is None:
            group = next((g for pattern, g in self._patterns if fnmatch.fnmatchcase(name, pattern)), None)
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
            for health, circuit, tokens_per_minute in carried:  # on the loop, once all is built
                health.reconfigure(circuit, tokens_per_minute)
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

    async def ready(self) -> dict[str, bool]:
        """Readiness of every deployment, checked concurrently."""
        deployments = list(self.deployments())
        results = await asyncio.gather(*(_ready(d.backend) for d in deployments))
        return {d.id: ok for d, ok in zip(deployments, results, strict=True)}

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*(d.backend.aclose() for d in self.deployments()), return_exceptions=True)


def _counter(dep: DeploymentConfig, where: str) -> PromptCounter | None:
    if dep.tokenizer is None:
        return None
    try:
        return PromptCounter.load(dep.tokenizer)
    except Exception as exc:
        raise ConfigError(f"config error at {where}.tokenizer: cannot load {dep.tokenizer!r} ({exc})") from None


Carried = list[tuple[DeploymentHealth, CircuitConfig, int | None]]  # kept healths and their new settings


def _build_groups(
    settings: Settings, build: BackendBuilder, reuse: dict[tuple[str, str], Deployment]
) -> tuple[list[ModelGroup], Carried]:
    """The groups for ``settings``, reusing ``reuse``'s deployments where they are unchanged, and
    the kept healths to reconfigure once the whole table is built (a config error changes nothing).
    Touches nothing the loop uses: it may run in a worker thread."""
    groups = []
    carried: Carried = []
    for i, config in enumerate(settings.models):
        deployments = []
        for j, dep in enumerate(config.deployments):
            old = reuse.get((config.name, dep.id))
            if old is not None and old.config == dep:  # its backend stays; new circuit settings apply to it
                if old.health.config != config.circuit:
                    carried.append((old.health, config.circuit, dep.tokens_per_minute))
                deployments.append(old)
                continue
            if old is not None and _same_upstream(old.config, dep):  # its circuit, holds and token window stay
                health = old.health
                carried.append((health, config.circuit, dep.tokens_per_minute))
            else:
                health = DeploymentHealth(config.circuit, tokens_per_minute=dep.tokens_per_minute)
            deployments.append(Deployment(dep, build(dep), health, _counter(dep, f"models[{i}].deployments[{j}]")))
        groups.append(ModelGroup(config, deployments))
    return groups, carried


def _same_upstream(old: DeploymentConfig, new: DeploymentConfig) -> bool:
    """Whether a changed deployment still calls the same upstream model with the same credentials."""
    return (old.provider, old.model, old.api_base, old.api_key) == (new.provider, new.model, new.api_base, new.api_key)


async def _retire(deployment: Deployment) -> None:
    """Close a removed deployment's backend once its in-flight requests are done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETIRE_GRACE_SECONDS
    while deployment.backend.stats().in_flight > 0 and loop.time() < deadline:
        await asyncio.sleep(0.5)
    await deployment.backend.aclose()


async def _ready(backend: Backend, timeout: float = 5.0) -> bool:
    try:
        async with asyncio.timeout(timeout):
            return bool(await backend.ready())
    except Exception:
        return False
