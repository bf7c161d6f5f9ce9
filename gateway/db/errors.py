"""Telling database failures apart: the database is unavailable (try again later) or it rejected
the values of a statement (trying again will fail the same way).

SQLAlchemy wraps the driver's exception (``.orig``), which may wrap the driver's own (``__cause__``,
e.g. asyncpg's, carrying the PostgreSQL SQLSTATE); both helpers look down that chain.
"""

from __future__ import annotations

from sqlalchemy import exc as sa

# SQLSTATE classes of a database that cannot take work now: connection exception (08), invalid
# authorisation (28), invalid catalog name (3D: the database is gone or renamed), transaction
# rollback (40: serialisation failure, deadlock), insufficient resources (53), operator
# intervention (57: shutdown, cannot connect now), system error (58).
UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "3D", "40", "53", "57", "58"})
# Data exception (22: too long, out of range, bad encoding) and integrity constraint violation (23).
BAD_DATA_SQLSTATE_CLASSES = frozenset({"22", "23"})


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(out) < 8 and all(current is not seen for seen in out):
        out.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return out


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return state if isinstance(state, str) else None


def is_unavailable(exc: BaseException) -> bool:
    """The database could not be reached or cannot take work for now (an outage, not the statement)."""
    for e in _chain(exc):
        if isinstance(e, (OSError, sa.DisconnectionError, sa.TimeoutError, sa.InterfaceError, sa.OperationalError)):
            return True  # OSError covers refused connections, resolution failures and timeouts
        if isinstance(e, sa.DBAPIError) and e.connection_invalidated:
            return True
        if (state := _sqlstate(e)) is not None and state[:2] in UNAVAILABLE_SQLSTATE_CLASSES:
            return True
    return False


def is_bad_data(exc: BaseException) -> bool:
    """The database (or the driver, encoding parameters) rejected the values themselves: a
    constraint violation, a value too long or out of range, a value of the wrong type."""
    if is_unavailable(exc):
        return False
    for e in _chain(exc):
        if isinstance(e, (sa.IntegrityError, sa.DataError, ValueError, TypeError, OverflowError)):
            return True
        if (state := _sqlstate(e)) is not None and state[:2] in BAD_DATA_SQLSTATE_CLASSES:
            return True
    return False
