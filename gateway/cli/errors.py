"""The CLI never prints a traceback: whatever a command raises becomes one line on stderr that says
what went wrong and what to do about it (``SWITCHYARD_DEBUG=1`` shows the traceback instead).

``explain`` maps the common mistakes (an un-migrated or unreachable database, an unknown tenant or
key, a bad value) to their fix; ``GuardedTyper`` applies it around every command.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import typer
from alembic.util.exc import CommandError
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, NoSuchTableError, SQLAlchemyError

from gateway.admin.service import AdminError, NotFound
from gateway.db.engine import safe_url
from gateway.db.migrate import SchemaNotReady
from gateway.errors import ParameterError

DEBUG_ENV = "SWITCHYARD_DEBUG"
_UNMIGRATED = ("no such table", "undefinedtable", "relation")
_UNREACHABLE = ("connect", "refused", "timeout", "timed out", "unable to open database", "authentication failed",
                "name or service", "no route", "could not translate", "database \"", "server closed")
_LISTS = {"tenant": "switchyard tenant list", "key": "switchyard key list"}
# a write's errors, never a connection's: the database's own full disk comes as its error, not as one of these
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else ""


def explain(exc: BaseException, url: str | URL | None = None) -> str:
    """One line: what failed, and the fix for the usual causes."""
    where = f" at {safe_url(url)}" if url is not None else ""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # e.g. from an anyio task group
        return explain(exc.exceptions[0], url)
    if isinstance(exc, SchemaNotReady | ParameterError):
        return first_line(getattr(exc, "message", exc))
    if isinstance(exc, NotFound):
        hint = next((f" (see `{cmd}`)" for word, cmd in _LISTS.items() if word in exc.message.lower()), "")
        return first_line(exc.message) + hint
    if isinstance(exc, AdminError):
        return first_line(exc.message)
    reason = first_line(getattr(exc, "orig", None) or exc)
    if isinstance(exc, NoSuchTableError) or (isinstance(exc, DBAPIError) and
                                             any(s in reason.lower() for s in _UNMIGRATED)):
        return f"the database{where} is not migrated ({reason}): run `switchyard db upgrade --config <your config>`"
    if isinstance(exc, OSError) and exc.filename is not None and not isinstance(exc, ConnectionError | TimeoutError):
        # a file the command reads or writes (an --output, a folder), not the database: sockets have no file name
        return f"{exc.filename}: {exc.strerror or reason}"
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:  # under a redirected listing or an export's -o
        return f"cannot write the output: {exc.strerror or reason}"
    if isinstance(exc, ConnectionError | TimeoutError) or (isinstance(exc, OSError) and exc.errno is not None) or (
            isinstance(exc, SQLAlchemyError) and any(s in reason.lower() for s in _UNREACHABLE)):
        return (f"cannot reach the database{where}: {reason}. Check that it is running and that database.url "
                "in the config (or SWITCHYARD__DATABASE__URL) points at it")
    if isinstance(exc, SQLAlchemyError):
        return f"database error{where}: {reason}"
    if isinstance(exc, CommandError):  # alembic: an unknown or unreachable revision
        return reason
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {reason}"
    if isinstance(exc, ValueError | OverflowError):
        return reason
    return f"{type(exc).__name__}: {reason} (set {DEBUG_ENV}=1 to see the traceback)"


def debugging() -> bool:
    """``SWITCHYARD_DEBUG=1``: a command that fails shows the traceback instead of its one line
    (an explained mistake too: call it in the ``except`` block and re-raise)."""
    return bool(os.environ.get(DEBUG_ENV))


def die(message: str, code: int = 1) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(code)


class GuardedTyper(typer.Typer):
    """A Typer app whose commands end in one line on stderr, never in a traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise SystemExit(130) from None
        except Exception as exc:
            if debugging():
                raise
            die(explain(exc))
