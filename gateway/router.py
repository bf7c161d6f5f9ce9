"""Public model names -> model groups -> deployments -> Backends.

``Router.resolve(name)`` finds the group for a public name or alias; ``ModelGroup.attempts()``
yields the deployments to try for one request, in order. For now that is a single weighted pick
(``pick()``); strategies, retries, fallbacks and circuit breakers extend ``attempts()`` later
without changing its callers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from backends.base import Backend
from gateway.settings import DeploymentConfig, ModelGroupConfig, Settings

BackendBuilder = Callable[[DeploymentConfig], Backend]


@dataclass
class Deployment:
    config: DeploymentConfig
    backend: Backend

    @property
    def id(self) -> str:
        return self.config.id


class ModelGroup:
    """One public model: its names and the deployments serving it."""

    def __init__(self, config: ModelGroupConfig, deployments: list[Deployment], rng: random.Random | None = None) -> None:
        if not deployments:
            raise ValueError(f"model {config.name!r} has no deployments")
        self.config = config
        self.deployments = deployments
        self._rng = rng or random.Random()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.config.name, *self.config.aliases)

    def pick(self) -> Deployment:
        """One deployment, chosen at random in proportion to the configured weights."""
        if len(self.deployments) == 1:
            return self.deployments[0]
        weights = [d.config.weight for d in self.deployments]
        return self._rng.choices(self.deployments, weights=weights, k=1)[0]

    def attempts(self) -> Iterator[Deployment]:
        """The deployments to try for one request, in order (today: one weighted pick)."""
        yield self.pick()


class Router:
    def __init__(self, groups: list[ModelGroup]) -> None:
        self.groups = groups
        self._by_name = {name: group for group in groups for name in group.names}

    @classmethod
    def from_settings(cls, settings: Settings, build: BackendBuilder) -> Router:
        return cls([ModelGroup(g, [Deployment(d, build(d)) for d in g.deployments]) for g in settings.models])

    def resolve(self, name: str) -> ModelGroup | None:
        return self._by_name.get(name)

    def deployments(self) -> Iterator[Deployment]:
        for group in self.groups:
            yield from group.deployments

    async def ready(self) -> dict[str, bool]:
        """Readiness of every deployment, checked concurrently."""
        deployments = list(self.deployments())
        results = await asyncio.gather(*(_ready(d.backend) for d in deployments))
        return {d.id: ok for d, ok in zip(deployments, results, strict=True)}

    async def aclose(self) -> None:
        await asyncio.gather(*(d.backend.aclose() for d in self.deployments()), return_exceptions=True)


async def _ready(backend: Backend, timeout: float = 5.0) -> bool:
    try:
        async with asyncio.timeout(timeout):
            return bool(await backend.ready())
    except Exception:
        return False
