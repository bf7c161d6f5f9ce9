"""The 429 a refused admission answers, with its ``Retry-After`` and rate-limit headers, and the
usage row that meters it."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.contracts import BUDGET_SPENT, QUOTA_REFUSED, Principal, QuotaExceeded, Ticket, UsageRecord
from gateway.errors import ApiError, retry_after_header


def refused(exc: QuotaExceeded, ratelimit_headers: Callable[[Ticket], dict[str, str]]) -> ApiError:
    """A spent budget as OpenAI's ``insufficient_quota`` (its wait, to the period's end, is hours: the
    SDKs would retry it at once, or the Anthropic SDK sleep it out), and no SDK told to retry what no
    wait they would take admits; ``ratelimit_headers``: the client's dialect's (``gateway.quotas.headers``)."""
    headers = retry_after_header(exc.retry_after)
    if exc.retry_after is None or exc.budget:
        headers["x-should-retry"] = "false"
    if exc.ticket is not None:
        headers.update(ratelimit_headers(exc.ticket))
    code = BUDGET_SPENT if exc.budget else QUOTA_REFUSED
    return ApiError(429, exc.message, type=code if exc.budget else None, code=code, headers=headers)


def refusal_record(request_id: str, principal: Principal, model: str, endpoint: str, stream: bool,
                   error: ApiError) -> UsageRecord:
    """The one usage row (no tokens) of a request the quotas refused, or could not admit (their 503):
    ``model`` as the request named it ("" for one that names none: a poll of a stored response)."""
    return UsageRecord(
        request_id=request_id, key_id=principal.key_id, tenant_id=principal.tenant_id, model=model,
        deployment=None, provider=None, endpoint=endpoint, started_at=time.time(), status=error.status,
        error_type=QUOTA_REFUSED if error.status == 429 else error.code, stream=stream,
    )
