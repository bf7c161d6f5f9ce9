"""API key material: generation, hashing, visible prefix, ids.

A key is ``sk-sy-`` + 32 random bytes (url-safe base64). Only its SHA-256 is stored, with the
first few characters kept visible so people can tell keys apart; the key itself is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-sy-"
VISIBLE_CHARS = 12  # "sk-sy-" plus six random characters
RANDOM_BYTES = 32


@dataclass(frozen=True)
class NewKey:
    """A freshly generated key: ``secret`` goes to the user once, the rest to the database."""

    secret: str
    key_hash: str
    prefix: str


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key() -> NewKey:
    secret = KEY_PREFIX + secrets.token_urlsafe(RANDOM_BYTES)
    return NewKey(secret=secret, key_hash=hash_key(secret), prefix=secret[:VISIBLE_CHARS])


def looks_like_key(token: str) -> bool:
    return token.startswith(KEY_PREFIX) and 20 <= len(token) <= 200


def same_hash(a: str, b: str) -> bool:
    """Constant-time equality of two key hashes (``hash_key``: of equal length, so a secret is
    compared by its hash and its length does not leak)."""
    return hmac.compare_digest(a.encode(), b.encode())


def new_id(kind: str) -> str:
    """A public identifier such as ``ten_3f9a…`` or ``key_…`` (not a secret)."""
    return f"{kind}_{secrets.token_hex(8)}"
