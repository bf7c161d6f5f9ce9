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
from typing import Any

import msgspec

from backends.factory import build_backend
from gateway.pipeline import Pipeline
from gateway.routing.router import BackendBuilder
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("switchyard.reload")

SUPERVISOR_PID_ENV = "SWITCHYARD_SUPERVISOR_PID"  # set by ``switchyard serve`` for several workers


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
        self.pipeline.settings = _reloadable(self.pipeline.settings, fresh)
        for hook in self.pipeline.services.on_reload:  # no await in between: no request sees half of it
            hook(fresh)
        return fresh

    async def reload_everywhere(self) -> tuple[Settings, bool]:
        """Reload this process, or (under a multi-worker supervisor) check the file and ask the
        supervisor to restart every worker on it. Returns the new settings and whether the
        workers are being restarted."""
        supervisor = os.environ.get(SUPERVISOR_PID_ENV)
        if supervisor is None or int(supervisor) != os.getppid():
            return await self.reload(), False
        with _refusal_logged(self.config_path):
            fresh = self._load()  # a bad file is refused before any worker restarts
        os.kill(int(supervisor), signal.SIGHUP)
        log.info("asked the supervisor (pid %s) to restart the workers on %s", supervisor, self.config_path)
        return fresh, True

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


def _reloadable(current: Settings, fresh: Settings) -> Settings:
    """The running settings with the reloadable sections taken from ``fresh``."""
    return msgspec.structs.replace(current, models=fresh.models, prices=fresh.prices)
