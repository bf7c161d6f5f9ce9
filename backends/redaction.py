"""Provider credentials kept out of what upstreams say back.

An upstream's error message is relayed to the client (and logged): some echo the request's headers,
the gateway's own credentials for that provider among them. Each HTTP deployment registers the
credentials it sends (``register_headers``: its API key, whatever header carries it) when it is
built, and every ``BackendError`` message (its ``param`` and ``code`` too) is redacted of all registered
ones as it is made. What is
relayed as it came is looked at only where it says it failed (``redact_failure``, ``redact_json``,
called by the relays on an error object or a failed answer alone): never an answer's or a normal
chunk's words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

MIN_LENGTH = 8  # shorter values (test keys such as "k") would redact ordinary words
MASK = "[redacted]"
# Header names that say their value is a credential: authorization, x-api-key, api-key (Azure),
# x-goog-api-key, *-token, cookies, ...
_SECRET_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|credential|signature", re.IGNORECASE)

_known: set[str] = set()


def register(secret: str | None) -> None:
    """Redact ``secret`` from every upstream error message from now on (kept across reloads: a
    replaced key is still redacted)."""
    if secret and len(secret) >= MIN_LENGTH:
        _known.add(secret)


def register_headers(headers: Mapping[str, str]) -> None:
    """Register the values of ``headers`` (those a deployment sends with every request) whose names
    say they are credentials; of ``Authorization: <scheme> <credential>`` the credential as well."""
    for name, value in headers.items():
        if _SECRET_HEADER.search(name):
            register(value)
            _, _, credential = value.strip().partition(" ")
            register(credential.strip())


def redact(text: str) -> str:
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_failure(response: object) -> None:
    """Redact, in place, the error object of a relayed Responses object that failed, each of its
    strings (its message, code, param: relayed as it came otherwise, so only a failure's words are
    looked at)."""
    if isinstance(response, dict) and response.get("status") == "failed" and isinstance(response.get("error"), dict):
        response["error"] = _masked(response["error"])[0]


def redact_error_event(event: dict[str, Any]) -> dict[str, Any]:
    """A relayed Responses stream's own ``error`` event, each of its strings redacted."""
    masked: dict[str, Any] = _masked(event)[0]
    return masked


def redact_json(data: bytes) -> bytes:
    """JSON ``data`` (an answer or event that carries an error, relayed as it came) with every
    registered secret masked in each of its strings, keys too; ``data`` itself when it holds none
    (or is no JSON)."""
    if not _known:
        return data
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return data
    masked, changed = _masked(value)
    return msgspec.json.encode(masked) if changed else data


def _masked(value: Any) -> tuple[Any, bool]:
    """``value`` (decoded JSON) with its strings redacted, and whether any changed."""
    if isinstance(value, str):
        said = redact(value)
        return said, said is not value
    if isinstance(value, list):
        items = [_masked(item) for item in value]
        return [item for item, _ in items], any(changed for _, changed in items)
    if isinstance(value, dict):
        pairs = [(_masked(k), _masked(v)) for k, v in value.items()]
        return {k: v for (k, _), (v, _) in pairs}, any(a or b for (_, a), (_, b) in pairs)
    return value, False
