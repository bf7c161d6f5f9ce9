"""Config reload without restart: re-read the YAML and swap the routing table and prices.

Triggered by SIGHUP (single-process serving) or ``POST /admin/v1/reload``. Only ``models`` and
``prices`` take effect; server, database, Redis and auth settings need a restart. The new prices
reach every consumer: the pipeline's settings, and the services' ``on_reload`` hooks (the price
table that admission reserves money from and the usage writer prices records with, and the
model_prices table). A file that cannot be read or parsed, or one that would leave a gateway
serving models with none (an empty or truncated file), is refused and the old config stays.

With several workers (``switchyard serve --workers N``), SIGHUP goes to uvicorn's supervisor, which
replaces the workers one by one (each new one ready before an old one drains and exits, as on
SIGTERM), and every new worker reads the whole file. The reload endpoint then checks the file and
asks the supervisor for that same rolling restart, so every worker changes, not only the one that
answered.

Settings only a restart applies (every section but ``models`` and ``prices`` with one worker; with
several, the ``server`` keys the supervisor applies) are compared with the running ones: a change is
named in one warning line and in the reload's answer, not dropped in silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from backends.factory import build_backend
from gateway.pipeline import Pipeline
from gateway.routing.router import BackendBuilder
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("switchyard.reload")

SUPERVISOR_PID_ENV = "SWITCHYARD_SUPERVISOR_PID"  # set by ``switchyard serve`` for several workers
SUPERVISOR_SERVER_ENV = "SWITCHYARD_SUPERVISOR_SERVER"  # and its config file's ``server`` section (JSON)
RELOADABLE = frozenset({"models", "prices"})
# What the supervisor of several workers applies itself (its socket, uvicorn's options, the
# environment its workers inherit): new workers reading the file do not change these.
SUPERVISOR_KEYS = frozenset({"host", "port", "workers", "header_timeout", "body_timeout",
                             "max_connections_per_client", "drain_seconds", "trusted_proxies"})


class Reloaded(NamedTuple):
    settings: Settings
    workers_restarting: bool  # several workers: the supervisor replaces them on the file
    restart_required: list[str]  # changed keys that only a restart applies ("server.port")


class Reloader:
    def __init__(
        self, pipeline: Pipeline, config_path: str | Path | None, build: BackendBuilder = build_backend
    ) -> None:
        self.pipeline = pipeline
        self.config_path = Path(config_path) if config_path else None
        self._build = build
        self._running: set[asyncio.Task[Any]] = set()  # reloads under way (a task nobody holds may be collected)

    async def reload(self) -> Settings:
        """Apply the config file now; ConfigError (naming the key) leaves the old table in place.
        The new backends are built off the event loop, which keeps serving meanwhile. A reload
        runs to its end even if its caller is cancelled (an admin client that stopped waiting)."""
        task = asyncio.get_running_loop().create_task(self._reload())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def _reload(self) -> Settings:
        with _refusal_logged(self.config_path):
            fresh = self._load()
            await self.pipeline.services.router.reload(fresh, self._build)  # one at a time
        _warn_unapplied(self.config_path, _changed(self.pipeline.settings, fresh))
        self.pipeline.settings = _reloadable(self.pipeline.settings, fresh)
        for hook in self.pipeline.services.on_reload:  # no await in between: no request sees half of it
            hook(fresh)
        return fresh

    async def reload_everywhere(self) -> Reloaded:
        """Reload this process, or (under a multi-worker supervisor) check the file and ask the
        supervisor to restart every worker on it."""
        supervisor = os.environ.get(SUPERVISOR_PID_ENV)
        if supervisor is None or int(supervisor) != os.getppid():
            running = self.pipeline.settings
            fresh = await self.reload()
            return Reloaded(fresh, False, _changed(running, fresh))
        with _refusal_logged(self.config_path):
            fresh = self._load()  # a bad file is refused before any worker restarts
        os.kill(int(supervisor), signal.SIGHUP)
        log.info("asked the supervisor (pid %s) to restart the workers on %s", supervisor, self.config_path)
        return Reloaded(fresh, True, supervisor_unapplied(fresh))  # the supervisor logs them

    def _load(self) -> Settings:
        """The config file's settings, or ConfigError (naming what is wrong) if they cannot replace
        the running ones."""
        if self.config_path is None:
            raise ConfigError("this gateway was started without a config file; nothing to reload")
        fresh = load_settings(self.config_path)
        serving = len(self.pipeline.settings.models)
        if serving and not fresh.models:  # an empty or truncated file would turn every request into a 404
            raise ConfigError(f"config file {self.config_path} defines no models (the gateway serves {serving});"
                              " refusing to reload it")
        return fresh

    def install_sighup(self) -> bool:
        """Reload on SIGHUP (only possible from the main thread, where uvicorn runs one worker)."""
        if self.config_path is None or threading.current_thread() is not threading.main_thread():
            return False
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
        return True

    def _on_sighup(self) -> asyncio.Task[None]:
        """Start a reload (the signal callback must not wait for it); the task, for tests."""
        task = asyncio.get_running_loop().create_task(self._reload_on_sighup())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def _reload_on_sighup(self) -> None:
        try:
            await self.reload()
            log.info("reloaded %s on SIGHUP", self.config_path)
        except ConfigError:
            pass  # logged, in one line
        except Exception as exc:  # nobody awaits this task: say what failed
            log.error("reload of %s failed, keeping the previous config: %s: %s", self.config_path,
                      type(exc).__name__, exc)


@contextlib.contextmanager
def _refusal_logged(path: Path | None) -> Iterator[None]:
    """A refused reload is logged in one line (the API answers 400 with the same message)."""
    try:
        yield
    except ConfigError as exc:
        log.error("reload of %s refused, keeping the previous config: %s", path, exc)
        raise


def _changed(current: Settings, fresh: Settings) -> list[str]:
    """The keys outside ``models`` and ``prices`` whose values differ (names only: no secret shown)."""
    keys: list[str] = []
    for section in current.__struct_fields__:
        if section in RELOADABLE:
            continue
        old, new = getattr(current, section), getattr(fresh, section)
        if isinstance(old, msgspec.Struct):
            keys += [f"{section}.{k}" for k in old.__struct_fields__ if getattr(old, k) != getattr(new, k)]
        elif old != new:
            keys.append(section)
    return sorted(keys)


def supervisor_unapplied(fresh: Settings) -> list[str]:
    """The ``server`` keys that the supervisor of several workers applies and ``fresh`` changes."""
    if (started := os.environ.get(SUPERVISOR_SERVER_ENV)) is None:
        return []
    old = msgspec.json.decode(started, type=type(fresh.server))
    return sorted(f"server.{k}" for k in SUPERVISOR_KEYS if getattr(old, k) != getattr(fresh.server, k))


def _warn_unapplied(path: Path | None, keys: list[str]) -> None:
    if keys:
        log.warning("reload of %s: %s changed, which only a restart applies; the running values stay",
                    path, ", ".join(keys))


def _reloadable(current: Settings, fresh: Settings) -> Settings:
    """The running settings with the reloadable sections taken from ``fresh``."""
    return msgspec.structs.replace(current, models=fresh.models, prices=fresh.prices)
