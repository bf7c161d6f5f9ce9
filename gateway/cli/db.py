"""`switchyard db upgrade|downgrade|current|wait`: Alembic migrations on the configured database."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli.errors import debugging, explain
from gateway.db import migrate
from gateway.db.engine import Database, safe_url
from gateway.db.schema_compat import SchemaState
from gateway.settings import ConfigError, Settings, load_settings, parse_settings

# Tables take the terminal's width (or $COLUMNS), 80 columns when piped: scripts read --json instead.
console = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 80)


class StderrConsole(Console):
    """Progress lines and errors. Once stderr's reader is gone (``db upgrade 2>&1 | head``) its lines
    are dropped: Rich's default ends the process there, and a migration's progress line comes
    before its step's commit (ending there would undo the step and stop the upgrade half-way)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


err = StderrConsole(stderr=True, highlight=False, soft_wrap=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (default: $SWITCHYARD_CONFIG or config/default.yaml)."),
]

def visible(text: str) -> str:
    """``text`` with control and format characters (ESC, NUL, bidi overrides...) shown as escapes,
    so a name a tenant chose can neither drive the terminal nor disguise itself."""
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def safe(text: str) -> str:
    """``text`` for a Rich console: :func:`visible`, and Rich markup (``[red]``) shown literally."""
    return escape(visible(text))


db_app = typer.Typer(no_args_is_help=True, help="Database migrations.")


def settings_from(config: Path | None) -> Settings:
    """The server's settings: the given file, else $SWITCHYARD_CONFIG, else config/default.yaml
    when it exists, else the built-in defaults (env overrides apply in every case)."""
    try:
        if config is not None or os.environ.get("SWITCHYARD_CONFIG") or Path("config/default.yaml").exists():
            return load_settings(config)
        return parse_settings({})
    except ConfigError as exc:
        fail(str(exc), 2)
        raise AssertionError("unreachable") from None


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {safe(message)}")
    raise typer.Exit(code)


def require_revision(revision: str) -> None:
    """An empty ``--revision`` (an unset shell variable) is one line, not alembic's bare AssertionError."""
    if not revision:
        fail("--revision is empty: give head, base, a revision id (see `switchyard db current`) or a step "
             "such as -1")


@db_app.command()
def upgrade(config: ConfigOpt = None, revision: str = typer.Option("head", help="Target revision.")) -> None:
    """Migrate the database up to REVISION (default: the latest)."""
    url = settings_from(config).database.url
    require_revision(revision)
    target = revision if revision != "head" else migrate.head_revision()
    err.print(f"migrating {safe_url(url)} to {target} ...")
    try:
        reached = migrate.upgrade(url, revision, progress=lambda line: err.print(f"  {safe(line)}"))
    except Exception as exc:
        if debugging():
            raise
        fail(f"upgrade of {safe_url(url)} failed: {explain(exc, url)}")
    console.print(f"database {safe_url(url)} is at revision {reached or '(empty)'}")


@db_app.command()
def downgrade(
    config: ConfigOpt = None, revision: str = typer.Option("-1", help="Target revision ('base': empty).")
) -> None:
    """Migrate the database down to REVISION (default: one step)."""
    url = settings_from(config).database.url
    require_revision(revision)
    try:
        reached = migrate.downgrade(url, revision, progress=lambda line: err.print(f"  {safe(line)}"))
    except Exception as exc:
        if debugging():
            raise
        fail(f"downgrade of {safe_url(url)} failed: {explain(exc, url)}")
    console.print(f"database {safe_url(url)} is at revision {reached or '(empty)'}")


@db_app.command()
def current(
    config: ConfigOpt = None, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
) -> None:
    """Show the database's revision, the latest one of this version, and whether it may run on it."""
    url = settings_from(config).database.url

    async def run() -> SchemaState:
        db = Database.from_url(url)
        try:
            return await migrate.schema_state(db.engine)
        finally:
            await db.dispose()

    try:
        found = asyncio.run(run())
    except Exception as exc:
        if debugging():
            raise
        fail(explain(exc, url))
    if as_json:
        typer.echo(json.dumps({"current": found.current, "head": found.head, "up_to_date": found.current == found.head,
                               "usable": found.usable, "oldest_compatible": found.oldest}))
        return
    console.print(f"current: {found.current or '(empty)'}  head: {found.head}")
    if found.newer:
        verdict = found.problem() or "it records that this version may run on it"
        console.print(safe(f"newer than this version: {verdict}"))


@db_app.command()
def wait(
    config: ConfigOpt = None,
    timeout: float = typer.Option(600.0, min=0.0, max=86400.0, help="Seconds to wait before giving up."),
    interval: float = typer.Option(2.0, min=0.1, max=60.0, help="Seconds between checks."),
) -> None:
    """Wait until this version may run on the database: migrated to its latest revision, or to a newer
    one recording it as compatible (an init container runs this, so a new gateway starts only after
    the migration Job has finished, and an old one restarting during the rollout still starts). A
    newer schema that this version may not run on fails at once: no wait mends it."""
    url = settings_from(config).database.url

    async def poll() -> SchemaState | str:
        deadline = time.monotonic() + timeout
        last = "not checked yet"
        while True:
            db = Database.from_url(url)
            try:
                found = await migrate.schema_state(db.engine)
                if found.usable or found.newer:
                    return found
                last = found.problem() or ""
            except Exception as exc:
                last = f"unreachable ({type(exc).__name__}: {exc})"
            finally:
                await db.dispose()
            if time.monotonic() + interval > deadline:
                return f"{last} (after {timeout:g} s)"
            await asyncio.sleep(interval)

    found = asyncio.run(poll())
    if isinstance(found, str) or not found.usable:
        fail(f"database {safe_url(url)} is {found if isinstance(found, str) else found.problem()}")
        return
    console.print(f"database {safe_url(url)} is at revision {found.current}"
                  + (f", which records that this version ({found.head}) may run on it" if found.newer else ""))
