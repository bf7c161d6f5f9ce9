"""API keys (generation, hashing) and the SQL-backed Authenticator."""

from gateway.auth.authenticator import ADMIN_KEY_ID, SqlAuthenticator
from gateway.auth.keys import KEY_PREFIX, NewKey, generate_key, hash_key

__all__ = ["ADMIN_KEY_ID", "KEY_PREFIX", "NewKey", "SqlAuthenticator", "generate_key", "hash_key"]
