"""``DeploymentHealth``'s memory of tenants: a deployment serves many thousands over months."""

from __future__ import annotations

from gateway.routing.health import DeploymentHealth
from gateway.settings import CircuitConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tenants_served_before_the_window_are_forgotten() -> None:
    clock = Clock()
    health = DeploymentHealth(CircuitConfig(failures=2, window=10, cooldown=5), clock=clock)
    for i in range(9_000):
        health.on_success(0.1, f"t{i}")
    clock.now += 11
    health.on_success(0.1, "last")
    assert len(health._served) == 1  # was 9,001: kept until 10,000 piled up
    # the tenant circuit still tells one tenant failing from a failing deployment
    health.on_failure("bad")
    health.on_failure("bad")
    assert not health.admits("bad") and health.admits("other") and health.state == "closed"
    clock.now += 11  # nobody served in the window: the deployment's own circuit opens
    health.on_failure("x")
    health.on_failure("x")
    assert health.state == "open"


def test_tenant_circuits_that_cooled_down_are_forgotten() -> None:
    clock = Clock()
    health = DeploymentHealth(CircuitConfig(failures=1, window=10, cooldown=5), clock=clock)
    health.on_success(0.1, "good")
    for i in range(9_000):
        health.on_failure(f"t{i}")
    assert not health.admits("t0") and health.admits("good")
    clock.now += 5
    health.on_success(0.1, "good")
    health.on_failure("late")
    assert health._tenants._opened.keys() == {"late"}  # was 9,001
    assert health.admits("t0") and not health.admits("late")
