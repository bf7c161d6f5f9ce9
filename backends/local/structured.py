"""Wire spellings of structured output -> the engine's ``StructuredOutput``.

OpenAI's ``response_format`` (``json_object``, ``json_schema``; on text completions too, as vLLM
takes it there, though the gateway does not model it there, so an HTTP upstream gets it as sent),
vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``) and the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``. At most one may be
given, and none where the request's ``tool_choice`` forces a call (that call's grammar shapes the
output); a malformed one is a 400 naming the field (the engine's input processor then reports what
the grammar engine cannot compile), and so is a ``structured_outputs`` option the engine does not
honour (``whitespace_pattern``, ``structural_tag``, ``disable_additional_properties``, ...), never
silently dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from msgspec import UNSET

from backends.base import BadRequest
from backends.openai_wire import (
    ChatCompletionRequest,
    JSONSchemaFormat,
    ResponseFormat,
    SamplingFields,
    extra_params,
)
from engine.structured_output import StructuredOutput

_VLLM_KEYS = ("json", "regex", "choice", "grammar")
# The structured_outputs fields read here, and vLLM's two that change nothing here: the engine's
# JSON has no free whitespace (as ``disable_any_whitespace``) and it has one grammar backend.
_TAKEN_KEYS = frozenset({*_VLLM_KEYS, "json_object", "disable_any_whitespace", "disable_fallback"})


def _set(value: Any) -> bool:
    return value is not None and value is not UNSET


def _json_spec(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"the JSON schema is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, (dict, bool)):
        raise BadRequest("the JSON schema must be an object", param=param)
    return json.dumps(schema)  # as sent: the answer's keys come in the order its properties are listed


def _choice_spec(choice: Any, param: str) -> str:
    if not isinstance(choice, list) or not choice or not all(isinstance(c, str) for c in choice):
        raise BadRequest("choice must be a non-empty list of strings", param=param)
    return json.dumps(choice)


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest("must be a non-empty string", param=param)
    return value


_format_decoder = msgspec.json.Decoder(ResponseFormat | None)
_MISSING = re.compile(r"Object missing required field `([^`]+)`")


def _format_error(exc: msgspec.ValidationError) -> BadRequest:
    """A 400 naming the field of a completion's ``response_format``, as the gateway names chat's."""
    problem, sep, where = str(exc).rpartition(" - at `")
    if not sep:
        problem, where = str(exc), ""
    param = "response_format" + where.rstrip("`").removeprefix("$")
    if missing := _MISSING.match(problem):
        return BadRequest(f"missing required parameter '{param}.{missing[1]}'", param=f"{param}.{missing[1]}")
    return BadRequest(f"invalid value for '{param}': {problem}", param=param)


def response_format(request: SamplingFields) -> ResponseFormat | None:
    """Chat's ``response_format``, or a text completion's (an unmodelled field there) read as chat's:
    what chat's would refuse (``structural_tag``, a ``json_schema`` without a name) is a 400 naming it."""
    if isinstance(request, ChatCompletionRequest):
        return request.response_format if isinstance(request.response_format, ResponseFormat) else None
    raw = extra_params(request).get("response_format")
    if raw is None:
        return None
    try:
        return _format_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise _format_error(exc) from None


def from_request(request: SamplingFields) -> StructuredOutput | None:
    """The request's output constraint, or None."""
    found: list[StructuredOutput] = []
    fmt = response_format(request)
    if fmt is not None and fmt.type != "text":
        if fmt.type == "structural_tag":
            raise BadRequest("response_format type 'structural_tag' is not supported by the local engine",
                             param="response_format.type")
        if fmt.type == "json_object":
            found.append(StructuredOutput("json_object", "", "response_format"))
        else:
            js = fmt.json_schema
            if not isinstance(js, JSONSchemaFormat) or not _set(js.schema):
                raise BadRequest("json_schema.schema is required", param="response_format.json_schema.schema")
            param = "response_format.json_schema.schema"
            found.append(StructuredOutput("json", _json_spec(js.schema, param), param))
    so = request.structured_outputs
    if _set(so):
        assert isinstance(so, dict)
        for key, value in so.items():  # whitespace_pattern, structural_tag, ...: refused, never dropped
            if key not in _TAKEN_KEYS and value is not None and value is not False:
                raise BadRequest(f"structured_outputs.{key} is not supported by the local engine",
                                 param=f"structured_outputs.{key}")
        keys = [k for k in _VLLM_KEYS if so.get(k) is not None]
        if so.get("json_object"):
            keys.append("json_object")
        if len(keys) != 1:
            raise BadRequest(f"structured_outputs takes exactly one of {', '.join(_VLLM_KEYS)}",
                             param="structured_outputs")
        key = keys[0]
        param = f"structured_outputs.{key}"
        if key == "json":
            found.append(StructuredOutput("json", _json_spec(so[key], param), param))
        elif key == "choice":
            found.append(StructuredOutput("choice", _choice_spec(so[key], param), param))
        elif key == "json_object":
            found.append(StructuredOutput("json_object", "", param))
        else:
            found.append(StructuredOutput(key, _text(so[key], param), param))  # type: ignore[arg-type]
    if _set(request.guided_json):
        found.append(StructuredOutput("json", _json_spec(request.guided_json, "guided_json"), "guided_json"))
    if _set(request.guided_regex):
        found.append(StructuredOutput("regex", _text(request.guided_regex, "guided_regex"), "guided_regex"))
    if _set(request.guided_choice):
        found.append(StructuredOutput("choice", _choice_spec(request.guided_choice, "guided_choice"), "guided_choice"))
    if _set(request.guided_grammar):
        found.append(StructuredOutput("grammar", _text(request.guided_grammar, "guided_grammar"), "guided_grammar"))
    if len(found) > 1:
        raise BadRequest("give one output constraint (response_format, structured_outputs or guided_*), not "
                         "several", param=found[1].param)
    return found[0] if found else None


def output_constraint(request: SamplingFields, tool_grammar: StructuredOutput | None) -> StructuredOutput | None:
    """The constraint to generate with: ``tool_grammar`` (a forced tool call's, ``tools.ToolPlan``)
    or else the request's own. Both is a 400 naming the request's: it could not hold as well."""
    own = from_request(request)
    if tool_grammar is not None and own is not None:
        raise BadRequest(f"{own.param} cannot be combined with a tool_choice that forces a call (the call's "
                         "grammar shapes the output)", param=own.param)
    return tool_grammar or own
