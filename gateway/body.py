"""Request bodies: raw bytes decoded with msgspec into the wire Structs, errors naming ``param``.

``WireBody[T]`` is a Litestar DTO that does nothing but this decoding, so route handlers declare
``data: T`` (and the OpenAPI schema documents ``T``) while the gateway keeps control of every
error message: ``Expected `float` <= 2.0 - at `$.temperature``` becomes a 400 with
``param="temperature"``.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any, TypeVar

import msgspec
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.typing import FieldDefinition

from backends.openai_wire import set_extra_params
from gateway.errors import ApiError

T = TypeVar("T")

_MISSING = re.compile(r"Object missing required field `([^`]+)`")
# A JSON ``\\u0000`` escape not itself escaped (an odd run of backslashes before ``u0000``). NUL
# cannot be stored in PostgreSQL text and confuses C-string consumers upstream, so it is refused.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}
_fields: dict[type, frozenset[str]] = {}
_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
RAW_BODY = "_raw_body"  # the body's bytes, on a request type that keeps them (raw_body = True)


def _param_path(where: str) -> str | None:
    """``$.messages[0].role`` -> ``messages[0].role``; ``$`` -> None."""
    path = where.removeprefix("$").removeprefix(".")
    return path or None


def validation_error(exc: msgspec.ValidationError) -> ApiError:
    text = str(exc)
    problem, sep, where = text.rpartition(" - at `")
    if not sep:
        problem, where = text, "$"
    param = _param_path(where.rstrip("`"))
    if missing := _MISSING.match(problem):
        field = missing.group(1)
        param = f"{param}.{field}" if param else field
        return ApiError(400, f"missing required parameter '{param}'", param=param, code="missing_required_parameter")
    if param is None:
        return ApiError(400, f"invalid request body: {problem}", code="invalid_body")
    return ApiError(400, f"invalid value for '{param}': {problem}", param=param, code="invalid_value")


def decode_body(raw: bytes, type_: type[T]) -> T:
    """Decode a JSON body into ``type_`` or raise a 400 ApiError."""
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    # the substring test first: the pattern starts with a lookbehind, so searching it tries every byte
    if b"\x00" in raw or (b"\\u0000" in raw and _NUL_ESCAPE.search(raw)):
        raise ApiError(400, "the request body contains a NUL character (\\u0000), which is not allowed in any field",
                       code="invalid_value")
    try:
        body = decoder.decode(raw)
        if getattr(type_, "raw_body", False):  # translated requests keep the original for a same-dialect upstream
            body.__dict__[RAW_BODY] = raw
        elif hasattr(body, "__dict__"):  # a pass-through request: keep the fields it does not model
            keep_extra_params(body, raw)
        return body
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise ApiError(
            400, f"We could not parse the JSON body of your request ({exc}).", code="invalid_json"
        ) from None
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", code="invalid_json") from None


def keep_extra_params(body: Any, raw: bytes) -> None:
    """Record the top-level fields of ``raw`` that ``body``'s type does not model (as raw JSON), to be
    forwarded unchanged to an HTTP upstream (``backends.openai_wire.extra_params``)."""
    type_ = type(body)
    known = _fields.get(type_)
    if known is None:
        known = _fields[type_] = frozenset(f.encode_name for f in msgspec.structs.fields(type_))
    extra = {k: v for k, v in _raw_object.decode(raw).items() if k not in known}
    if extra:
        set_extra_params(body, extra)


class WireBody(AbstractDTO[T]):
    """A DTO over a msgspec Struct: decoding via :func:`decode_body`, schema from the Struct."""

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[DTOFieldDefinition, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: Any = None
    ) -> None:
        """No transfer model is needed: the Struct itself is the wire type."""

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any) -> Any:
        return schema_creator.for_field_definition(FieldDefinition.from_annotation(cls.model_type))

    def decode_bytes(self, value: bytes) -> Any:
        return decode_body(value, self.model_type)

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        raise ApiError(400, "the request body must be JSON (application/json)", code="invalid_body")
