"""The gateway's cap on generated tokens for chat requests that set none (``quotas.default_max_tokens``).

Admission reserves that many output tokens per sequence; the backends make the reservation hold:
an HTTP upstream is sent the cap as the request's limit, and an in-process engine, which knows its
context, stops at the cap or where the context ends, whichever comes first, rather than refusing a
limit the client never asked for. A limit the client set always wins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_current: ContextVar[int | None] = ContextVar("switchyard_output_cap", default=None)


@contextlib.contextmanager
def capped_output(cap: int | None) -> Iterator[None]:
    """Backend calls in the block generate at most ``cap`` tokens per sequence unless the request says."""
    token = _current.set(cap)
    try:
        yield
    finally:
        _current.reset(token)


def output_limit(requested: int | None, room: int | None = None) -> int | None:
    """The client's limit if it set one; else the gateway's cap (None: none), at most ``room``."""
    if requested is not None:
        return requested
    cap = _current.get()
    if cap is None:
        return None
    return cap if room is None else max(1, min(cap, room))
