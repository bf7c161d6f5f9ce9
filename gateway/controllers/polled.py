"""Answers to an admitted poll (a request counted against requests/min alone, ``Pipeline.admit_poll``):
its answer and its errors carry the admission's rate-limit headers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from backends.base import BackendError
from gateway.errors import ApiError, from_backend_error
from gateway.json_response import JSONResponse


@contextmanager
def headed(headers: dict[str, str]) -> Iterator[None]:
    """An admitted poll's error answer (its 404, 400, an upstream's failure) with its rate-limit
    ``headers``, as its answer and a request's failure after admission carry them."""
    try:
        yield
    except ApiError as exc:
        exc.headers = headers | exc.headers
        raise
    except BackendError as exc:
        error = from_backend_error(exc)
        error.headers = headers | error.headers
        raise error from None


def json_answer(body: dict[str, Any], headers: dict[str, str]) -> JSONResponse:
    return JSONResponse(msgspec.json.encode(body), headers=headers)
