"""Request bodies of the admin API (msgspec; unknown fields are errors) and their decoding."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.call import MAX_WEIGHT, MIN_WEIGHT
from gateway.admin.params import nul_error, nul_field
from gateway.admin.service import MAX_COST_BUDGET, MAX_SECONDS, AdminError
from gateway.body import WireBody, request_content
from gateway.quotas.limits import Limits

T = TypeVar("T")
NonNeg = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # fits the BIGINT column
Int32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]  # fits an INTEGER column (a larger value would be a 500)
Budget = Annotated[float, Meta(ge=0, le=MAX_COST_BUDGET)]
Weight = Annotated[float, Meta(ge=MIN_WEIGHT, le=MAX_WEIGHT)]


class Body(Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A request body as decoded, never changed (an empty one is a PATCH's default)."""


class TenantCreate(Body, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=200)]
    weight: Weight = 1.0


class TenantUpdate(Body, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=200)] | UnsetType = UNSET
    status: Literal["active", "disabled"] | UnsetType = UNSET
    weight: Weight | UnsetType = UNSET


class KeyCreate(Body, frozen=True):
    tenant_id: str | None = None
    admin: bool = False
    name: Annotated[str, Meta(max_length=200)] = ""
    models: list[str] | None = None
    expires_at: datetime | None = None
    expires_in_seconds: Annotated[float, Meta(gt=0, le=MAX_SECONDS)] | None = None


class KeyRotate(Body, frozen=True):
    grace_seconds: Annotated[float, Meta(ge=0, le=MAX_SECONDS)] = 86400.0


class LimitsBody(Body, frozen=True):
    """PUT: absent fields mean "no limit"; PATCH: absent fields stay as they are, null clears."""

    requests_per_minute: Int32 | None | UnsetType = UNSET
    tokens_per_minute: Int32 | None | UnsetType = UNSET
    max_concurrency: Int32 | None | UnsetType = UNSET
    token_budget: NonNeg | None | UnsetType = UNSET
    cost_budget: Budget | None | UnsetType = UNSET
    budget_period: Literal["day", "month", "total"] | UnsetType = UNSET

    def changes(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__struct_fields__ if getattr(self, f) is not UNSET}

    def as_limits(self) -> Limits:
        return Limits(**self.changes())


class AdminBody(WireBody[T]):
    """Documents the Struct in the OpenAPI schema; decodes with :func:`decode` (empty body = {}),
    once the body's ``Content-Encoding`` is undone as for the API's routes."""

    def decode_bytes(self, value: bytes) -> Any:
        return decode(request_content(self.asgi_connection, value), self.model_type)


_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]+)`")


def decode(body: bytes, type: type[T]) -> T:
    """Decode a JSON body, turning every problem into a 400 that names the parameter."""
    if not body.strip():
        body = b"{}"
    try:
        decoded = msgspec.json.decode(body, type=type)
    except msgspec.ValidationError as exc:
        problem, sep, where = str(exc).rpartition(" - at `")
        param = where.rstrip("`").removeprefix("$").removeprefix(".") if sep else None
        if unknown := _UNKNOWN_FIELD.match(problem or str(exc)):  # the field itself, not the object holding it
            param = f"{param}.{unknown.group(1)}" if param else unknown.group(1)
        raise AdminError(f"invalid request body: {problem or exc}", param=param or None) from None
    except msgspec.DecodeError:
        raise AdminError("the request body must be a JSON object") from None
    if (field := nul_field(decoded)) is not None:  # PostgreSQL text cannot hold one
        raise nul_error(field)
    return decoded
