"""Random ids for the request path: 32 hex digits from the OS's CSPRNG, as ``secrets.token_hex(16)``,
read ahead in batches (one ``getrandom`` call per id cost about 3% of a request)."""

from __future__ import annotations

import os

_ID_BYTES = 16
_POOL_BYTES = _ID_BYTES * 256  # ids read from the OS per system call
_pool = b""
_taken = 0


def random_id() -> str:
    global _pool, _taken
    if _taken >= len(_pool):
        _pool, _taken = os.urandom(_POOL_BYTES), 0
    _taken += _ID_BYTES
    return _pool[_taken - _ID_BYTES : _taken].hex()


def _forget_pool() -> None:
    """A forked child must not hand out its parent's ids."""
    global _pool, _taken
    _pool, _taken = b"", 0


os.register_at_fork(after_in_child=_forget_pool)
