"""A request's usage row, read back from the database a served gateway meters into."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select

from gateway.db import Database
from gateway.db.models import UsageRow


async def usage_row(db: Database, request_id: str, timeout: float = 10) -> UsageRow:
    """The row of ``request_id``, once the usage writer (it flushes in the background) has written it."""
    deadline = time.monotonic() + timeout
    while True:
        async with db.session() as s:
            row = await s.scalar(select(UsageRow).where(UsageRow.request_id == request_id))
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no usage row for {request_id}"
            return row
        await asyncio.sleep(0.2)
