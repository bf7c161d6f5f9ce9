"""A Messages request's ``output_config`` (the anthropic SDK's ``messages.parse``, and ``effort``) in
its translation to an OpenAI chat request (``anthropic_request``): ``format``, a JSON schema that
Anthropic makes the answer's text follow, is a strict ``json_schema`` ``response_format``;
``effort`` is ``reasoning_effort``, passed as it is (as the Responses dialect passes
``reasoning.effort``). Any other key is refused by the translation, naming it."""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

from backends.openai_wire import (
    ChatCompletionRequest,
    JSONSchemaFormat,
    ResponseFormat,
    extra_params,
    set_extra_params,
)

T = TypeVar("T")
SCHEMA_NAME = "output"  # the json_schema's name: Anthropic's format has none


class Translation(Protocol):
    """What this reads of ``anthropic_request._Translation``: a 400 naming a field, or a stand-in."""

    def refuse(self, param: str, message: str) -> None: ...

    def convert(self, value: Any, type_: type[T], param: str) -> T | None: ...


class OutputFormat(Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    format: OutputFormat | None | UnsetType = UNSET
    effort: str | None | UnsetType = UNSET


_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(OutputConfig))


def add_output_config(raw: dict[str, Any], chat: ChatCompletionRequest, translation: Translation) -> None:
    """Put ``output_config`` (``raw``, as sent) in ``chat``; a key it cannot carry (null asks nothing)
    or a value of the wrong shape goes to ``translation`` to refuse."""
    for key, value in raw.items():
        if key not in _KEYS and value is not None:
            translation.refuse(
                f"output_config.{key}", f"the field 'output_config.{key}' is served only by Anthropic deployments"
            )
    config = translation.convert(raw, OutputConfig, "output_config")
    if config is None:
        return
    if isinstance(config.format, OutputFormat):  # strict: Anthropic enforces the schema
        chat.response_format = ResponseFormat(
            type="json_schema", json_schema=JSONSchemaFormat(name=SCHEMA_NAME, schema=config.format.schema, strict=True)
        )
    if isinstance(config.effort, str):
        effort = msgspec.Raw(msgspec.json.encode(config.effort))
        set_extra_params(chat, extra_params(chat) | {"reasoning_effort": effort})
