"""What a request to an ``anthropic`` deployment may opt into: the betas of its ``anthropic-beta``
header, server tools (a tool with a ``type``, run by Anthropic and billed to the deployment's key)
and files of the Files API (a ``file_id``, which any holder of that key may read).

Each is a 400 naming it unless the deployment's config lists it (``anthropic_betas``,
``server_tools``; a ``file_id`` needs the Files API beta listed). A server tool's calls that the
answer's usage reports (web searches) are priced as the config's ``prices`` say (``per_tool_call``), as
are long context's rates (``long_prompts``); a code execution container's hours are not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from backends.base import BadRequest
from backends.config import DeploymentConfig

BETA_HEADER = "anthropic-beta"
FILES_API_BETA = "files-api-2025-04-14"
_CLIENT_TOOL_TYPES = (None, "custom")  # a tool the client runs (it has an input_schema)
_FREE_FORM = "input"  # a tool_use block's arguments: the client's own JSON, whatever its keys


def check_opt_ins(config: DeploymentConfig, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
    """Refuse (BadRequest) a beta, server tool or file reference in ``body`` and ``headers`` (what
    goes upstream) that ``config`` does not allow."""
    _check_betas(config.anthropic_betas, headers.get(BETA_HEADER))
    _check_tools(config.server_tools, body.get("tools"))
    if FILES_API_BETA not in config.anthropic_betas:
        _check_no_files(body)


def _requested_betas(header: str | None) -> list[str]:
    """The betas of an ``anthropic-beta`` header: comma-separated, blanks around them ignored."""
    return [beta for part in (header or "").split(",") if (beta := part.strip())]


def _check_betas(allowed: list[str], header: str | None) -> None:
    for beta in _requested_betas(header):
        if beta not in allowed:
            raise BadRequest(f"{BETA_HEADER}: the beta {beta!r} is not enabled for this model "
                             "(its deployment's anthropic_betas does not list it)", param=BETA_HEADER)


def _check_tools(allowed: list[str], tools: Any) -> None:
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in _CLIENT_TOOL_TYPES and kind not in allowed:
            param = f"tools[{i}].type"
            raise BadRequest(f"{param}: the tool type {kind!r} (a tool Anthropic runs or defines) is not enabled "
                             "for this model (its deployment's server_tools does not list it)", param=param)


def _check_no_files(body: Mapping[str, Any]) -> None:
    for field in ("system", "messages"):
        if (where := next(_file_references(body.get(field), field), None)) is not None:
            raise BadRequest(f"{where}: files of the Files API (file_id) are not enabled for this model "
                             f"(its deployment's anthropic_betas does not list {FILES_API_BETA!r})", param=where)


def _file_references(value: Any, where: str) -> Iterator[str]:
    """Where an object holding a ``file_id`` lies in ``value`` (a source of type ``file``, a
    ``container_upload`` block, ...), but in a tool call's arguments. Iterative: any depth."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, list):
            stack.extend((child, f"{at}[{i}]") for i, child in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            if item.get("file_id") is not None:  # a citation of a plain document carries "file_id": null
                yield at
                continue
            free_form = str(item.get("type", "")).endswith("tool_use")
            stack.extend((child, f"{at}.{key}") for key, child in reversed(list(item.items()))
                         if not (free_form and key == _FREE_FORM))
