"""Pages of the admin listings (tenants, keys): rows in creation order, ``limit`` at a time, after
the row whose id ``after`` names, in the shape of OpenAI's lists (``has_more``, ``first_id``,
``last_id``). Without ``limit`` a listing is whole, as it was before pages.

The order is ``(created_at, id)``, so a page boundary is stable while rows are added: a new row
comes after every page already read, and two rows created in the same instant keep their order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, and_, or_
from sqlalchemy.ext.asyncio import AsyncSession

MAX_LIMIT = 1000
T = TypeVar("T")


class UnknownCursor(LookupError):
    """``after`` names no row of the listing."""


@dataclass(frozen=True)
class PageQuery:
    limit: int | None = None  # None: every row
    after: str | None = None  # the id of the last row of the previous page


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


async def read_page(s: AsyncSession, query: Select[Any], model: Any, page: PageQuery) -> tuple[list[Any], bool]:
    """The rows of ``query`` (a select of ``model`` rows, unordered) on ``page``, and whether more follow."""
    if page.after is not None:
        # a row of this listing, not only of its table: another tenant's key would place the page at its time
        cursor = await s.scalar(query.where(model.id == page.after))
        if cursor is None:
            raise UnknownCursor(page.after)
        query = query.where(or_(model.created_at > cursor.created_at,
                                and_(model.created_at == cursor.created_at, model.id > cursor.id)))
    query = query.order_by(model.created_at, model.id)
    if page.limit is None:
        return list(await s.scalars(query)), False
    rows = list(await s.scalars(query.limit(page.limit + 1)))
    return rows[:page.limit], len(rows) > page.limit
