"""How admin commands print: rich tables for people, JSON (``--json``) for scripts.

Tables fit an 80-column terminal: no vertical rules, times to the minute, and identifiers never
broken across lines (other cells fold instead); ``--json`` carries every field in full."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, is_dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import typer
from rich.table import Table

from gateway.cli.db import console, safe


def plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


# identifiers and dates: never folded
WHOLE = frozenset({"id", "tenant_id", "key_id", "tenant", "key", "prefix", "day", "created_at", "expires_at"})


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return f"{value:%Y-%m-%d %H:%M}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, float):  # its shortest repr in plain decimals: 7.65e-08 is 0.0000000765, not 0.00000008
        if not math.isfinite(value):
            return str(value)
        text = format(Decimal(repr(value)), "f")
        return (text.rstrip("0").rstrip(".") if "." in text else text) or "0"
    return str(value)


def show(rows: list[dict[str, Any]], as_json: bool, columns: list[str] | None = None, title: str | None = None,
         empty: str = "(none)") -> None:
    if as_json:
        typer.echo(json.dumps([plain(r) for r in rows], indent=2))
        return
    if not rows:
        console.print(f"{title + ': ' if title else ''}{empty}")
        return
    columns = columns or list(rows[0])
    table = Table(title=title, box=None, padding=(0, 2, 0, 0), header_style="bold underline", title_justify="left")
    for c in columns:
        numeric = all(isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool) for r in rows)
        table.add_column(safe(c), no_wrap=c in WHOLE, overflow="fold", justify="right" if numeric else "left",
                         min_width=min(len(c), 8))
    for r in rows:
        table.add_row(*[safe(cell(r.get(c))) for c in columns])
    console.print(table)


def show_one(row: Any, as_json: bool) -> None:
    data = plain(row)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    raw = asdict(row) if is_dataclass(row) and not isinstance(row, type) else row
    for k, v in raw.items():
        table.add_row(safe(k), safe(cell(v)))
    console.print(table)


def print_secret(secret: str, as_json: bool, data: dict[str, Any]) -> None:
    if as_json:
        typer.echo(json.dumps({**plain(data), "key": secret}, indent=2))
        return
    show_one(data, False)
    console.print("\n[bold]API key (shown once, store it now):[/bold]")
    typer.echo(secret)
