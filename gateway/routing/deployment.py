"""One deployment as the router holds it: its config, its backend, its health."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.base import Backend, Tokenizing
from backends.prompt_count import PromptCounter
from gateway.routing.health import DeploymentHealth
from gateway.settings import CircuitConfig, DeploymentConfig


@dataclass(eq=False)
class Deployment:
    config: DeploymentConfig
    backend: Backend
    health: DeploymentHealth = field(default_factory=lambda: DeploymentHealth(CircuitConfig()))
    counter: PromptCounter | None = None  # the configured tokenizer (``tokenizer:``), for reservations
    # what counts a prompt for reservations: the backend when it knows its tokenizer, else the
    # counter (a runtime-checkable Protocol's isinstance is too slow to repeat per request)
    prompt_counter: Tokenizing | PromptCounter | None = field(init=False, default=None)
    retired: bool = field(init=False, default=False)  # a reload removed it: no new attempt may start on it

    def __post_init__(self) -> None:
        self.prompt_counter = self.backend if isinstance(self.backend, Tokenizing) else self.counter

    @property
    def id(self) -> str:
        return self.config.id

    def accepts(self, after_hold: bool = False, tenant: str | None = None) -> bool:
        """Whether it may take a request (of ``tenant``) now (``after_hold``: once the wait its
        upstream asked for is over)."""
        limit = self.config.max_concurrency
        if limit is not None and self.backend.stats().in_flight >= limit:
            return False
        return self.health.available(after_hold, tenant) and self.health.within_tpm()
