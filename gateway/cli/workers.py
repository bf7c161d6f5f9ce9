"""Several workers (``switchyard serve --workers N``) under uvicorn's supervisor, which gives up when
they cannot start.

uvicorn restarts a worker that exits, whatever the reason: one whose start-up fails (a deployment's
model file that cannot load, a database gone at start) fails again, and the supervisor lives on
serving nothing. Here a worker that exits before it finished start-up ends the supervisor, with the
worker's error in one line, when no other worker is serving or when its slot failed that way
``MAX_STARTUP_FAILURES`` times in a row. A worker that dies after start-up is restarted, and a
rolling restart (SIGHUP) keeps the old worker when a new one fails, as before; an old worker it
replaced is retired (``gateway.drain.RETIRE_SIGNAL``: it drains while ``/readyz`` stays ready, as
the host serves on); a SIGTERM or SIGINT during it stops it there, and every worker, old and new,
drains at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from multiprocessing import Pipe
from pathlib import Path
from socket import socket
from typing import Any

import msgspec
from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from gateway.drain import RETIRE_SIGNAL
from gateway.settings import ConfigError, load_settings
from gateway.telemetry.shared_metrics import METRICS_DIR_ENV, retire_exited

log = logging.getLogger("uvicorn.error")

MAX_STARTUP_FAILURES = 3  # in a row, in one worker's slot, while another worker serves


class StartupFailure(msgspec.Struct, frozen=True):
    """Why a worker could not start: the one line to print and the exit status it calls for."""

    message: str
    status: int  # 2 for a config error (as with one worker), else 1


def _failure(exc: BaseException) -> StartupFailure:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # the lifespan's task group
        exc = exc.exceptions[0]
    if isinstance(exc, ConfigError):
        return StartupFailure(str(exc), 2)
    first = (str(exc).strip().splitlines() or [""])[0]  # SQLAlchemy's errors add the statement below
    return StartupFailure(f"a worker failed at start-up: {type(exc).__name__}: {first}", 1)


_STARTED = b"started"  # a worker's word, on its pipe, that its app finished start-up


class Worker(Process):
    """A uvicorn worker that, failing before it finished start-up (the app factory or the app's
    lifespan start-up raised), sends the supervisor why, over a pipe of its own; and says on it when
    its app has started, so that one killed right after (before a health check saw it serving) is
    replaced, not taken for a configuration that cannot start."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        self.failure_in, self.failure_out = Pipe(duplex=False)
        self._said_started = False
        self._failed: bytes | None = None  # the failure it sent, once read
        super().__init__(config, sockets)

    def start(self) -> None:
        super().start()
        # the child holds its ends now: a worker that dies mid-health-check is seen at once (EOF),
        # not after the health check's timeout
        self.child_conn.close()
        self.failure_out.close()

    def said_started(self) -> bool:
        """Whether the worker said its app finished start-up (it may have exited since)."""
        self._read()
        return self._said_started

    def failure(self) -> StartupFailure:
        """What the worker sent, once it has exited before finishing start-up."""
        self._read()
        if self._failed is not None:
            return msgspec.msgpack.decode(self._failed, type=StartupFailure)
        return StartupFailure(f"a worker exited with status {self.exitcode} before finishing start-up", 1)

    def _read(self) -> None:
        try:
            while self.failure_in.poll():
                message = self.failure_in.recv_bytes()
                if message == _STARTED:
                    self._said_started = True
                else:
                    self._failed = message
        except (OSError, EOFError):
            pass

    def target(self, sockets: list[socket] | None = None) -> None:  # pragma: no cover  (in the worker)
        threading.Thread(target=self.always_pong, daemon=True).start()
        try:
            self.config.load()  # the app factory: settings, deployments (a local model loads here)
        except Exception as exc:
            self._report(exc)
            if not isinstance(exc, ConfigError):
                raise  # an unexpected error keeps its traceback
            sys.exit(STARTUP_FAILURE)
        self.config.loaded_app = self._watch_startup(self.config.loaded_app)
        self.server.run(sockets)

    def _watch_startup(self, app: Any) -> Callable[..., Awaitable[None]]:
        """The app, for the lifespan only (connections, made after start-up, call ``app`` itself):
        an error before start-up completed is reported."""

        async def lifespan(scope: Any, receive: Any, send: Any) -> None:
            self.config.loaded_app = app

            async def told(message: Any) -> None:
                if message["type"] == "lifespan.startup.complete":
                    self.failure_out.send_bytes(_STARTED)
                await send(message)

            try:
                await app(scope, receive, told)
            except BaseException as exc:
                if not self.server.started:
                    self._report(exc)
                raise

        return lifespan

    def _report(self, exc: BaseException) -> None:
        self.failure_out.send_bytes(msgspec.msgpack.encode(_failure(exc)))


class Supervisor(Multiprocess):
    """uvicorn's supervisor with ``Worker``s; ``failure`` says why it gave up, if it did."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self.failure: StartupFailure | None = None
        self._serving: set[int] = set()  # pids of workers that finished start-up
        self._failed_starts: dict[int, int] = {}  # slot -> start-up failures in a row
        self._retiring: list[Process] = []  # old workers a rolling restart told to drain

    def handle_signals(self) -> None:
        """The queued signals in order, read from the queue itself: a rolling restart may take
        a stop signal out of it while it runs."""
        while self.signal_queue:
            sig = self.signal_queue.pop(0)
            handler = getattr(self, f"handle_{signal.Signals(sig).name[3:].lower()}", None)
            if handler is not None:
                handler()

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            worker = Worker(self.config, self.sockets)
            worker.start()
            self.processes.append(worker)

    def handle_hup(self) -> None:
        """A rolling restart on the config file, naming first what changed that it cannot apply."""
        from gateway.reload import supervisor_unapplied

        try:
            changed = supervisor_unapplied(load_settings(os.environ.get("SWITCHYARD_CONFIG"), warn=False))
        except ConfigError:
            changed = []  # the new workers say what is wrong with the file, and the old ones stay
        if changed:
            log.warning("SIGHUP: %s changed in the config file, which only a restart of `switchyard serve` "
                        "applies; the running values stay", ", ".join(changed))
        super().handle_hup()

    def restart_all(self) -> None:
        """uvicorn's rolling restart (each new worker serving before an old one drains), which a
        SIGTERM or SIGINT stops at any step instead of waiting until it has finished: the new worker
        not yet serving is killed, and an old one already draining goes on draining with the rest."""
        for idx, old in enumerate(self.processes):
            if self._stop_requested():
                return
            new = Worker(self.config, self.sockets)
            new.start()
            if not self._wait_until_ready(new):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    log.error("New child process [%s] was not ready in time; keeping worker [%s] and aborting "
                              "the restart.", new.pid, old.pid)
                return
            self._retire(old)
            self.processes[idx] = new
            self._retiring.append(old)
            while old.exitcode is None and not self._stop_requested():
                old.process.join(0.2)
            if old.exitcode is not None:
                self._retiring.remove(old)

    @staticmethod
    def _retire(old: Process) -> None:
        """Tell an old worker its replacement serves: it closes its listener at once and drains,
        staying ready (the host serves on). One that never said its app started has no handler
        for that yet, and gets a SIGTERM."""
        if not (isinstance(old, Worker) and old.said_started()) or old.exitcode is not None:
            old.terminate()
            return
        os.kill(old.pid, RETIRE_SIGNAL)  # type: ignore[arg-type]  # started
        log.info("Retired child process [%s]", old.pid)
        old.parent_conn.close()
        old.child_conn.close()

    def _wait_until_ready(self, process: Process) -> bool:
        deadline = time.monotonic() + self.config.timeout_worker_healthcheck
        while time.monotonic() < deadline and not self._stop_requested() and process.process.is_alive():
            if process.is_ready(timeout=0.5):
                return True
            time.sleep(0.1)
        return False

    def _stop_requested(self) -> bool:
        """Whether the supervisor is stopping, taking the first queued SIGTERM or SIGINT (a later
        one stays queued: ``join_all`` passes it on as a second one)."""
        if not self.should_exit.is_set():
            for sig in self.signal_queue:
                if sig in (signal.SIGTERM, signal.SIGINT):
                    self.signal_queue.remove(sig)
                    (self.handle_term if sig == signal.SIGTERM else self.handle_int)()
                    break
        return self.should_exit.is_set()

    def join_all(self) -> None:
        """Wait for the workers to drain (the ones a rolling restart retired too); a second SIGTERM
        (or a SIGINT) meanwhile is passed on to them, which ends their drain at once.

        A worker still starting when the stop began may not have heard its SIGTERM (one signalled
        between fork and exec loses it) and would serve on, the supervisor waiting for it forever:
        each such worker is told again once it says its app started. One that did hear it is
        stopping already, and the repeat finds it with no request yet to cut."""
        starting = [p for p in self.processes + self._retiring if isinstance(p, Worker) and not p.said_started()]
        while running := [p for p in self.processes + self._retiring if p.process.exitcode is None]:
            if any(sig in (signal.SIGTERM, signal.SIGINT) for sig in self.signal_queue):
                self.signal_queue.clear()
                for process in running:
                    os.kill(process.pid, signal.SIGTERM)  # type: ignore[arg-type]  # started
            for worker in [w for w in starting if w.said_started()]:
                starting.remove(worker)
                if worker.exitcode is None:
                    log.info("Child process [%s] started after the stop began: terminating it again", worker.pid)
                    os.kill(worker.pid, signal.SIGTERM)  # type: ignore[arg-type]  # started
            running[0].process.join(0.2)

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            started = process._healthcheck(self.config.timeout_worker_healthcheck) if process.exitcode is None else None
            if started is not None:
                if started and process.pid not in self._serving:
                    self._serving.add(process.pid)  # type: ignore[arg-type]
                    self._failed_starts.pop(idx, None)
                continue
            process.kill()  # hung, or gone
            process.join()
            if process.pid in self._serving or (isinstance(process, Worker) and process.said_started()):
                self._serving.discard(process.pid)
            elif self._give_up(idx, process):
                return
            if self.should_exit.is_set():
                return
            log.info("Child process [%s] died", process.pid)
            self.processes[idx] = Worker(self.config, self.sockets)
            self.processes[idx].start()
        self._retire_metrics()

    def _retire_metrics(self) -> None:
        """Fold the metrics files of workers that exited (replaced, or crashed) into one."""
        if (directory := os.environ.get(METRICS_DIR_ENV)) is None:
            return
        try:
            retire_exited(Path(directory), {p.pid for p in self.processes + self._retiring if p.pid is not None})
        except (OSError, msgspec.DecodeError):
            log.exception("folding exited workers' metrics failed")

    def _give_up(self, idx: int, process: Process) -> bool:
        """A worker exited before finishing start-up: stop when no other worker serves, or when
        its slot keeps failing so."""
        failed = self._failed_starts[idx] = self._failed_starts.get(idx, 0) + 1
        serving = any(p.pid in self._serving and p.exitcode is None for p in self.processes if p is not process)
        if serving and failed < MAX_STARTUP_FAILURES:
            return False
        self.failure = process.failure() if isinstance(process, Worker) else StartupFailure(
            f"a worker exited with status {process.exitcode} before finishing start-up", 1)
        log.error("Child process [%s] failed to start, stopping the parent process.", process.pid)
        self.should_exit.set()
        return True
