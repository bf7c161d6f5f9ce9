"""The `switchyard` command: serving, database, admin and engine sub-commands.

Each sub-command group lives in its own module and is registered here. No command prints a
traceback (``gateway.cli.errors``).
"""

from gateway.cli.errors import GuardedTyper

app = GuardedTyper(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                   help="Switchyard LLM gateway and engine.")

from gateway.cli import admin as _admin  # noqa: E402
from gateway.cli.db import db_app as _db_app  # noqa: E402

app.add_typer(_db_app, name="db")
_admin.register(app)
from gateway.cli.audit import audit_app as _audit_app  # noqa: E402

app.add_typer(_audit_app, name="audit")
from gateway.cli import usage as _usage  # noqa: E402

_usage.register(app)

from gateway.cli import serve as _serve  # noqa: E402

_serve.register(app)
from backends.local.cli import register as _engine_register  # noqa: E402

_engine_register(app)
from backends.local.cli import engine_app as _engine_app  # noqa: E402
from gateway.cli.engine_serve import register as _engine_serve_register  # noqa: E402

_engine_serve_register(_engine_app)
