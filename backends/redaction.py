"""Provider credentials kept out of what upstreams say back.

An upstream's error message is relayed to the client (and logged): some echo the request's headers,
the gateway's own key for that provider among them. Each HTTP deployment registers its key here when
it is built, and every ``BackendError`` message is redacted of all registered keys as it is made:
on the error path only, never on an answer's.
"""

from __future__ import annotations

MIN_LENGTH = 8  # shorter values (test keys such as "k") would redact ordinary words
MASK = "[redacted]"

_known: set[str] = set()


def register(secret: str | None) -> None:
    """Redact ``secret`` from every upstream error message from now on (kept across reloads: a
    replaced key is still redacted)."""
    if secret and len(secret) >= MIN_LENGTH:
        _known.add(secret)


def redact(text: str) -> str:
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_failure(response: object) -> None:
    """Redact, in place, the error message of a relayed Responses object that failed (relayed as
    it came otherwise, so only a failure's words are looked at)."""
    if isinstance(response, dict) and response.get("status") == "failed" \
            and isinstance(error := response.get("error"), dict) and isinstance(error.get("message"), str):
        error["message"] = redact(error["message"])
