"""Dashboard sessions: an API key is exchanged once for a signed, HttpOnly, SameSite=Strict cookie.

The cookie holds who signed in (key id, tenant id or admin), an expiry and a random nonce, signed
with HMAC-SHA256; the key itself is never stored. The CSRF token of a session is derived from its
nonce, so every form carries a value a cross-site page cannot read. Before sign-in, the login
form is protected with a double-submit cookie. Sessions signed by one worker verify in another
when ``dashboard.session_secret`` is set; without it each process uses a random secret.

The config's bootstrap admin key has no row whose revocation ends its sessions, so its sessions
carry a fingerprint of the key (an HMAC of its hash under the session secret, which a cookie's
reader cannot test guesses against): when the key is changed or removed from the config, the
sessions signed in with the old one end (``admin_fingerprint``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass

import msgspec

SESSION_COOKIE = "sy_session"
LOGIN_CSRF_COOKIE = "sy_login_csrf"
PATH = "/dashboard"


class SessionData(msgspec.Struct, array_like=True):
    key_id: str
    tenant_id: str | None
    is_admin: bool
    expires: float
    nonce: str
    admin_key: str = ""  # the bootstrap admin key's fingerprint, for a session signed in with it


def same_text(a: str, b: str) -> bool:
    """Constant-time equality of two strings, any characters (``hmac.compare_digest`` refuses to
    compare non-ASCII ``str``: a forged cookie or form token holding one was a 500)."""
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass
class Sessions:
    secret: bytes
    lifetime: float
    secure: bool = False
    admin_key_digest: str | None = None  # the hash of the config's bootstrap admin key, if any

    @classmethod
    def create(cls, secret: str | None, lifetime: float, secure: bool,
               admin_key_digest: str | None = None) -> Sessions:
        return cls(secret.encode() if secret else os.urandom(32), lifetime, secure, admin_key_digest)

    @property
    def admin_fingerprint(self) -> str | None:
        """What a session signed in with the config's bootstrap admin key holds of it (None: no key)."""
        if self.admin_key_digest is None:
            return None
        return self._sign(b"admin-key:" + self.admin_key_digest.encode())

    def _sign(self, data: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self.secret, data, hashlib.sha256).digest()).decode().rstrip("=")

    def issue(self, key_id: str, tenant_id: str | None, is_admin: bool,
              admin_key: str = "") -> tuple[str, SessionData]:
        data = SessionData(key_id, tenant_id, is_admin, time.time() + self.lifetime, secrets.token_urlsafe(16),
                           admin_key)
        payload = base64.urlsafe_b64encode(msgspec.msgpack.encode(data)).decode().rstrip("=")
        return f"{payload}.{self._sign(payload.encode())}", data

    def verify(self, cookie: str | None) -> SessionData | None:
        if not cookie or "." not in cookie:
            return None
        payload, _, signature = cookie.rpartition(".")
        if not same_text(signature, self._sign(payload.encode())):
            return None
        try:
            data = msgspec.msgpack.decode(
                base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)), type=SessionData
            )
        except (msgspec.DecodeError, ValueError):
            return None
        return data if data.expires > time.time() else None

    def csrf(self, session: SessionData) -> str:
        return self._sign(b"csrf:" + session.nonce.encode())

    def check_csrf(self, session: SessionData, token: str | None) -> bool:
        return token is not None and token != "" and same_text(token, self.csrf(session))

    def cookie_attrs(self, https: bool = False) -> dict[str, object]:
        """HttpOnly and SameSite=Strict always; Secure when configured or when the request came over
        HTTPS (directly, or via a trusted proxy's X-Forwarded-Proto as uvicorn applies it)."""
        return {"path": PATH, "httponly": True, "samesite": "strict", "secure": self.secure or https}
