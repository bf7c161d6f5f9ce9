"""OpenAPI response documentation shared by the OpenAI-compatible routes, and the ``@post`` they share."""

from __future__ import annotations

from typing import Any

from litestar import post
from litestar.openapi.datastructures import ResponseSpec

from backends.openai_wire import ErrorBody
from gateway.body import WireBody

_ERRORS = {
    400: "Invalid request: malformed JSON, wrong types or out-of-range values (``param`` names the field)",
    401: "Missing or invalid API key",
    403: "The key may not use this model",
    404: "Unknown model (or, on the admin API, tenant or key)",
    409: "Conflict with the current state (a name taken, a key already revoked)",
    413: "Request body too large",
    429: "Rate limited, or too many failed authentication attempts (see ``Retry-After``)",
    502: "The upstream provider sent an unusable answer",
    503: "The upstream provider (or a gateway dependency) is unavailable",
    504: "The upstream provider timed out",
}


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    chosen = statuses or tuple(_ERRORS)
    return {s: ResponseSpec(ErrorBody, description=_ERRORS[s], generate_examples=False) for s in chosen}


def api_post(path: str | list[str], body: type[Any], *, summary: str, description: str,
             answer: ResponseSpec) -> post:
    """A ``POST`` route of the model API: ``body`` decoded by ``WireBody`` (so the gateway words every
    400), the handler's answer sent without a return DTO, documented as ``answer`` and every error shape."""
    dto = WireBody[body]  # type: ignore[valid-type]  # the body type is a value here, as it is to Litestar
    return post(path, status_code=200, dto=dto, return_dto=None, summary=summary,
                description=description, responses={200: answer, **error_responses()})
