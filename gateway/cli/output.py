"""How admin commands print: rich tables for people, JSON (``--json``) for scripts."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from datetime import datetime
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


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return format(value, ".8f").rstrip("0").rstrip(".") or "0"
    return str(value)


def show(rows: list[dict[str, Any]], as_json: bool, columns: list[str] | None = None, title: str | None = None) -> None:
    rows = [plain(r) for r in rows]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    columns = columns or (list(rows[0]) if rows else [])
    table = Table(title=title)
    for c in columns:
        table.add_column(safe(c), overflow="fold")
    for r in rows:
        table.add_row(*[safe(cell(r.get(c))) for c in columns])
    console.print(table)


def show_one(row: Any, as_json: bool) -> None:
    data = plain(row)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(show_header=False)
    for k, v in data.items():
        table.add_row(safe(k), safe(cell(v)))
    console.print(table)


def print_secret(secret: str, as_json: bool, data: dict[str, Any]) -> None:
    if as_json:
        typer.echo(json.dumps({**plain(data), "key": secret}, indent=2))
        return
    show_one(data, False)
    console.print("\n[bold]API key (shown once, store it now):[/bold]")
    typer.echo(secret)
