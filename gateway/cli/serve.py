"""``switchyard serve``: run the gateway with uvicorn (uvloop + httptools)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import tempfile
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer

from gateway.cli.errors import debugging
from gateway.cli.http_protocol import (
    BODY_TIMEOUT_ENV,
    HEADER_TIMEOUT_ENV,
    MAX_CONNECTIONS_ENV,
    HeadDeadlineProtocol,
)
from gateway.settings import CONFIG_WARNED_ENV, ConfigError, load_settings
from gateway.trusted_proxies import forwarded_allow_ips

if TYPE_CHECKING:
    from uvicorn import Config

SETTLE_SECONDS = 5  # after server.drain_seconds: for the streams cut then to settle, before uvicorn cancels
# A rolling restart (SIGHUP, several workers) waits this long for each new worker to finish startup
# (migrations, and loading any local engine's model) before retiring an old one; uvicorn's default
# of 5 s aborts the restart whenever startup takes longer (a worker that dies is noticed at once;
# one that misses the deadline is killed and the old workers keep serving). The supervisor's
# liveness pings use the same figure.
WORKER_STARTUP_SECONDS = 120
APP_FACTORY = "gateway.app:create_app_from_env"
FORWARDED_ALLOW_IPS_ENV = "FORWARDED_ALLOW_IPS"


def serve(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML settings file (default: "
                                                "$SWITCHYARD_CONFIG or config/default.yaml).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: server.host from the config).")] = None,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help="Port (default: server.port from the "
                                             "config).")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Worker processes (default: server.workers).")] = None,
    header_timeout: Annotated[float | None, typer.Option(
        min=0.1, max=3600, help="Seconds a client may take to send a request's line and headers (default: "
        "server.header_timeout).")] = None,
) -> None:
    """Serve the OpenAI-compatible gateway."""
    import uvicorn

    from gateway.reload import SUPERVISOR_PID_ENV, SUPERVISOR_SERVER_ENV

    config = Path(config or os.environ.get("SWITCHYARD_CONFIG") or "config/default.yaml")  # as the admin commands
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _check_database(settings.database.url)
    # Workers are separate processes: they load the same file through the app factory, warning of nothing again.
    os.environ["SWITCHYARD_CONFIG"] = str(config.resolve())
    os.environ[CONFIG_WARNED_ENV] = "1"
    # On SIGTERM the app drains (gateway.drain), then uvicorn waits for in-flight requests, runs the
    # app's shutdown (usage flush) and re-raises the signal with the handler it found: make that a
    # clean exit (status 0).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    os.environ[HEADER_TIMEOUT_ENV] = str(header_timeout or settings.server.header_timeout)
    os.environ[BODY_TIMEOUT_ENV] = str(settings.server.body_timeout)
    os.environ[MAX_CONNECTIONS_ENV] = str(settings.server.max_connections_per_client)
    n_workers = workers or settings.server.workers
    if n_workers > 1:  # the workers' reload endpoint asks this process for a rolling restart
        os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
        os.environ[SUPERVISOR_SERVER_ENV] = msgspec.json.encode(settings.server).decode()  # what a reload cannot change
    options: dict[str, Any] = dict(
        factory=True,
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        workers=n_workers,
        loop="uvloop",
        http=HeadDeadlineProtocol,  # httptools, with a deadline on request heads
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(settings.server.drain_seconds + SETTLE_SECONDS),
        timeout_worker_healthcheck=WORKER_STARTUP_SECONDS,
        log_level="info",
        access_log=False,  # one access line per request costs more than the request; see telemetry.json_logs
        forwarded_allow_ips=forwarded_allow_ips(settings.server.trusted_proxies),  # travels to every worker
    )
    if FORWARDED_ALLOW_IPS_ENV in os.environ:  # uvicorn's own, which an explicit setting overrides
        typer.echo(f"warning: ${FORWARDED_ALLOW_IPS_ENV} is ignored; server.trusted_proxies names the trusted "
                   "proxies", err=True)
    uv_config = uvicorn.Config(APP_FACTORY, **options)
    sockets = [listen(uv_config.host, uv_config.port)]
    if n_workers == 1:
        _serve_one(uv_config, sockets)
    else:
        from gateway.telemetry.logs import install_logging

        install_logging(json=settings.telemetry.json_logs)  # the supervisor's lines, as its workers write theirs
        _supervise(uv_config, sockets)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the app loads (a local model may take minutes): a port in
    use or an address this host lacks ends ``serve`` at once, in one line. An empty host (an unset
    shell variable) is refused: it would bind every interface."""
    if not host:
        typer.echo("error: the host is empty: name an address (0.0.0.0 for every interface)", err=True)
        raise typer.Exit(2)
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None
    sock.set_inheritable(True)  # several workers: each child serves it
    return sock


def _serve_one(config: Config, sockets: list[socket.socket]) -> None:
    """One worker in this process, on ``sockets`` (as ``uvicorn.run`` does on its own)."""
    from uvicorn import Server
    from uvicorn.config import STARTUP_FAILURE

    server = Server(config)  # it loads the app factory: settings, deployments (a local model's too)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    if not server.started:
        raise typer.Exit(STARTUP_FAILURE)


def _supervise(config: Config, sockets: list[socket.socket]) -> None:
    """Run several workers (as ``uvicorn.run`` does); workers that cannot start end it in one line.
    The workers share their metrics through a directory of this server's, removed when it stops."""
    from gateway.cli.workers import Supervisor
    from gateway.telemetry.shared_metrics import METRICS_DIR_ENV

    supervisor = Supervisor(config, sockets=sockets)
    with tempfile.TemporaryDirectory(prefix="switchyard-metrics-") as metrics_dir:
        os.environ[METRICS_DIR_ENV] = metrics_dir  # the workers, spawned, inherit it
        supervisor.run()
    if supervisor.failure is not None:
        typer.echo(f"error: {supervisor.failure.message}", err=True)
        raise typer.Exit(supervisor.failure.status)


def _check_database(url: str) -> None:
    """Before any worker starts: the database must be reachable and migrated, or one line says why."""
    from gateway.db.engine import Database
    from gateway.db.migrate import SchemaNotReady, check_schema

    async def check() -> None:
        db = Database.from_url(url)
        try:
            await check_schema(db.engine)
        finally:
            await db.dispose()

    try:
        asyncio.run(check())
    except SchemaNotReady as exc:
        if debugging():
            raise
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _config_errors_in_one_line(command: Callable[..., None]) -> Callable[..., None]:
    """A ConfigError raised while serving (one worker builds its deployments in this process, e.g.
    a model file that cannot load) is one ``error:`` line and exit status 2, not a traceback."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return run


def register(app: typer.Typer) -> None:
    app.command("serve")(_config_errors_in_one_line(serve))
