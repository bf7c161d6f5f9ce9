"""The `switchyard` command: serving, database, admin and engine sub-commands.

Each sub-command group lives in its own module and is registered here.
"""

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Switchyard LLM gateway and engine.")
