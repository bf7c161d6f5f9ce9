"""The first field nested in a request that its wire types do not model, for whatever reads the Structs alone.

The gateway decodes a request into Structs that keep unknown top-level fields apart
(``extra_params``) but drop unknown nested ones; an HTTP upstream gets them from the client's raw
fields unchanged. The built-in engine and the transformers fallback read the Structs alone, so a
nested field they were sent and do not model (``stream_options.bogus``, ``messages[0].foo``) would
be ignored without a word: this finds it, in the client's raw fields, to be refused with a 400 naming it.
Any request type that keeps its raw fields is read so (the gateway's ``/tokenize`` too, whose
messages and tools the engine's tokenizer renders). Only the raw fields whose type holds a Struct
are read (again, as plain JSON); free-form objects (``dict[str, Any]``: a JSON schema,
``chat_template_kwargs``) are not looked into.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct, inspect

from backends.openai_wire import ChatMessage, CompletionRequest, ResponseFormat, raw_fields

# Unmodelled top-level fields an in-process provider reads, with the type it reads them as
# (a text completion's ``response_format``: ``backends.local.structured``).
_EXTRA_TYPES: dict[type, dict[str, Any]] = {CompletionRequest: {"response_format": ResponseFormat | None}}
# Fields only an answer has, on a message that a client sends back as history as it came (the
# openai SDK's message object): they ask nothing of the next answer, so they are not refused.
# (``thinking_blocks``, LiteLLM's, is one too: modelled on ChatMessage for the anthropic provider,
# it is taken here as these are.)
_ANSWER_ONLY: dict[type, frozenset[str]] = {
    ChatMessage: frozenset({"refusal", "annotations", "audio", "reasoning_content", "reasoning"})}
_checked: dict[type, dict[str, inspect.Type]] = {}  # request type -> its fields that hold a Struct, by wire name


def unknown_nested_field(request: Struct) -> str | None:
    """The path (``messages[0].foo``) of the first field in ``request`` that its types do not model
    below the top level; None when there is none or the gateway built the request (no raw fields)."""
    sent = raw_fields(request)
    if sent is None:
        return None
    fields = _fields(type(request))
    for name, raw in sent.items():
        if (type_ := fields.get(name)) is not None and (found := _unknown(msgspec.json.decode(raw), type_, name)):
            return found
    return None


def _fields(request_type: type) -> dict[str, inspect.Type]:
    fields = _checked.get(request_type)
    if fields is None:
        info = inspect.type_info(request_type)
        assert isinstance(info, inspect.StructType)
        typed = {f.encode_name: f.type for f in info.fields}
        typed |= {name: inspect.type_info(t) for name, t in _EXTRA_TYPES.get(request_type, {}).items()}
        fields = _checked[request_type] = {name: t for name, t in typed.items() if _holds_struct(t)}
    return fields


def _holds_struct(type_: inspect.Type) -> bool:
    type_ = _bare(type_)
    if isinstance(type_, inspect.StructType):
        return True
    if isinstance(type_, inspect.UnionType):
        return any(_holds_struct(t) for t in type_.types)
    return isinstance(type_, inspect.ListType) and _holds_struct(type_.item_type)


def _bare(type_: inspect.Type) -> inspect.Type:
    return type_.type if isinstance(type_, inspect.Metadata) else type_


def _unknown(value: Any, type_: inspect.Type, path: str) -> str | None:
    """The first field under ``value`` (decoded as ``type_`` was, at ``path``) that ``type_`` does not model."""
    type_ = _bare(type_)
    if isinstance(type_, inspect.UnionType):
        type_ = _member(value, type_)
    if isinstance(type_, inspect.ListType) and isinstance(value, list):
        for i, item in enumerate(value):
            if found := _unknown(item, type_.item_type, f"{path}[{i}]"):
                return found
    elif isinstance(type_, inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in type_.fields}
        answer_only = _ANSWER_ONLY.get(type_.cls, frozenset())
        for key, item in value.items():
            if key == type_.tag_field or key in answer_only:
                continue
            if key not in fields:
                return f"{path}.{key}"
            if found := _unknown(item, fields[key], f"{path}.{key}"):
                return found
    return None


def _member(value: Any, union: inspect.UnionType) -> inspect.Type:
    """The member of ``union`` that decoded ``value``: the Struct its tag names, else the one of its JSON kind."""
    members = [_bare(t) for t in union.types]
    if isinstance(value, list):
        return next((t for t in members if isinstance(t, inspect.ListType)), inspect.AnyType())
    if isinstance(value, dict):
        structs = [t for t in members if isinstance(t, inspect.StructType)]
        for struct in structs:
            if struct.tag_field is None or value.get(struct.tag_field) == struct.tag:
                return struct
    return inspect.AnyType()
