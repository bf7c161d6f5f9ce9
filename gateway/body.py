"""Request bodies: raw bytes decoded with msgspec into the wire Structs, errors naming ``param``.

``WireBody[T]`` is a Litestar DTO that does nothing but this decoding, so route handlers declare
``data: T`` (and the OpenAPI schema documents ``T``) while the gateway keeps control of every
error message: ``Expected `float` <= 2.0 - at `$.temperature``` becomes a 400 with
``param="temperature"``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Generator
from typing import Any, TypeVar

import msgspec
from litestar.connection import ASGIConnection
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.typing import FieldDefinition

from backends.openai_wire import set_extra_params, set_raw_fields
from gateway.errors import ApiError
from gateway.request_headers import request_headers

T = TypeVar("T")

_MISSING = re.compile(r"Object missing required field `([^`]+)`")
# A JSON ``\\u0000`` escape not itself escaped (an odd run of backslashes before ``u0000``). NUL
# cannot be stored in PostgreSQL text and confuses C-string consumers upstream, so it is refused.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}
_fields: dict[type, frozenset[str]] = {}
_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
RAW_BODY = "_raw_body"  # the body's bytes, on a request type that keeps them (raw_body = True)
# Content-Encoding -> zlib's wbits (gzip: a gzip header; deflate: zlib-wrapped, raw deflate also taken)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_DEFAULT_LIMIT = 10_000_000  # Litestar's default request_max_body_size, for a route that sets none


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


def _nul_refused(raw: bytes) -> ApiError:
    """The 400 for a body holding a NUL character, naming the field it lies in where the body parses."""
    where = _nul_path(raw)
    if where is None:
        return ApiError(400, "the request body contains a NUL character (\\u0000), which is not allowed in any "
                        "field", code="invalid_value")
    return ApiError(400, f"invalid value for '{where}': a NUL character (\\u0000) is not allowed in any field",
                    param=where, code="invalid_value")


def _nul_path(raw: bytes) -> str | None:
    """Where a string (a value or a key) holding a NUL lies in ``raw`` (``messages[0].content``), or
    None when ``raw`` is not JSON. Iterative: any depth."""
    try:
        stack: list[tuple[Any, str]] = [(msgspec.json.decode(raw), "")]
    except (msgspec.DecodeError, RecursionError):
        return None
    while stack:
        value, at = stack.pop()
        if isinstance(value, str) and "\x00" in value:
            return at or None
        if isinstance(value, dict):
            for key, child in reversed(value.items()):
                path = f"{at}.{key}" if at else key
                if "\x00" in key:
                    return path
                stack.append((child, path))
        elif isinstance(value, list):
            stack.extend((child, f"{at}[{i}]") for i, child in reversed(list(enumerate(value))))
    return None


def decode_body(raw: bytes, type_: type[T]) -> T:
    """Decode a JSON body into ``type_`` or raise a 400 ApiError."""
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    # the substring test first: the pattern starts with a lookbehind, so searching it tries every byte
    if b"\x00" in raw or (b"\\u0000" in raw and _NUL_ESCAPE.search(raw)):
        raise _nul_refused(raw)
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
        raise ApiError(400, f"We could not parse the JSON body of your request ({_decode_reason(raw, exc)}).",
                       code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", code="invalid_json") from None


_LONE_HIGH_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F])")


def _decode_reason(raw: bytes, exc: msgspec.DecodeError) -> str:
    """msgspec's reason, but for a high surrogate escape with no low one after it (half an emoji, as
    JavaScript's string slicing leaves it), which msgspec calls "Input data was truncated"."""
    if str(exc) == "Input data was truncated" and (lone := _LONE_HIGH_SURROGATE.search(raw)) is not None:
        escape = lone.group(1).decode()
        return f"{escape} at byte {lone.start(1)} is half of a UTF-16 surrogate pair, not a character"
    return str(exc)


def decoded_content(raw: bytes, encoding: str, limit: int | None) -> bytes:
    """``raw`` with its ``Content-Encoding`` (gzip, deflate or identity; several, comma-separated, are
    undone last first) undone: 413 when the decoded body passes ``limit`` (the route's maximum body
    size: a small bomb never inflates past it), 400 for data that does not decode, 415 for another
    coding. Called only for a request that has the header."""
    codings = [c for c in (c.strip() for c in encoding.lower().split(",")) if c not in ("identity", "")]
    for coding in codings:
        if coding not in _WBITS:
            raise ApiError(415, f"Content-Encoding {coding!r} is not supported: send the body uncompressed, or "
                           "with Content-Encoding gzip or deflate", code="unsupported_content_encoding")
    for coding in reversed(codings):
        wbits = _WBITS[coding]
        try:
            try:
                raw = _inflate(raw, wbits, limit or _DEFAULT_LIMIT)
            except zlib.error:
                if coding != "deflate":
                    raise
                raw = _inflate(raw, -zlib.MAX_WBITS, limit or _DEFAULT_LIMIT)  # raw deflate, as some clients send
        except zlib.error:
            raise ApiError(400, f"the request body is not valid {coding} data (Content-Encoding: {coding})",
                           code="invalid_body") from None
    return raw


def request_content(connection: ASGIConnection[Any, Any, Any, Any], raw: bytes) -> bytes:
    """``raw``, the body of ``connection``'s request, with its ``Content-Encoding`` (if it has one)
    undone by ``decoded_content`` within the route's maximum body size."""
    if (encoding := request_headers(connection.scope).get("content-encoding")) is None:
        return raw
    return decoded_content(raw, encoding, connection.route_handler.resolve_request_max_body_size())


MAX_GZIP_MEMBERS = 16  # a gzip body in more members is refused: each costs a copy of what follows it


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """``data`` inflated (each member of a multi-member gzip body in turn), at most ``limit`` bytes
    and ``MAX_GZIP_MEMBERS`` members (thousands of empty ones would inflate to nothing while their
    copies took the event loop for seconds)."""
    pieces: list[bytes] = []
    size = 0
    while True:
        if len(pieces) == MAX_GZIP_MEMBERS:
            raise zlib.error(f"more than {MAX_GZIP_MEMBERS} gzip members")
        inflater = zlib.decompressobj(wbits)
        piece = inflater.decompress(data, limit - size + 1)
        size += len(piece)
        if size > limit:
            raise RequestEntityTooLarge
        pieces.append(piece)
        if not inflater.eof:  # the data ended before the stream did
            raise zlib.error("truncated")
        data = inflater.unused_data
        if not data:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if wbits <= zlib.MAX_WBITS:  # deflate: one stream, nothing after it
            raise zlib.error("trailing data")


def keep_extra_params(body: Any, raw: bytes) -> None:
    """Record ``raw``'s top-level fields (as raw JSON): all of them, which an HTTP upstream gets with
    every nested byte as sent (``backends.openai_wire.raw_fields``), and apart those that ``body``'s
    type does not model (``backends.openai_wire.extra_params``, read by the other providers)."""
    type_ = type(body)
    known = _fields.get(type_)
    if known is None:
        known = _fields[type_] = frozenset(f.encode_name for f in msgspec.structs.fields(type_))
    fields = _raw_object.decode(raw)
    set_raw_fields(body, fields)
    extra = {k: v for k, v in fields.items() if k not in known}
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
        return decode_body(request_content(self.asgi_connection, value), self.model_type)

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        raise ApiError(400, "the request body must be JSON (application/json)", code="invalid_body")
