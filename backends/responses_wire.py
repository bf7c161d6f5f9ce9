"""What a Responses API upstream answers, relayed as it came (``backends.responses_http``)."""

from __future__ import annotations

from typing import Any

import msgspec

# the events a response's stream ends with: its response completed, incomplete, failed or cancelled
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "response.cancelled"})


class RelayedResponse(msgspec.Struct):
    """An upstream's ``response`` object as it came (``body``); ``model`` is the name the client used."""

    body: dict[str, Any]
    model: str = ""


class ResponsesEvent(msgspec.Struct):
    """One event of an upstream's Responses stream as it came (``data``, which holds its ``type``);
    ``model`` is the name the client used."""

    data: dict[str, Any]
    model: str = ""
