"""The calls of a provider's own tools read from its answers (billed per call: ``prices``'
``per_tool_call``): Anthropic's ``usage.server_tool_use``, and a Responses answer's output items."""

from __future__ import annotations

from typing import Any

import pytest

from backends.anthropic_wire import server_tool_calls
from backends.responses_http import hosted_tool_calls
from gateway.settings import ConfigError, parse_settings


@pytest.mark.parametrize(("usage", "calls"), [
    ({"input_tokens": 3, "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 1}},
     {"web_search": 2, "web_fetch": 1}),
    ({"server_tool_use": {"web_search_requests": 0, "code_execution_requests": 3}}, {"code_execution": 3}),
    # what is not a count of calls is no call: booleans, negatives, strings, other keys
    ({"server_tool_use": {"web_search_requests": True, "web_fetch_requests": -1, "x_requests": "2", "other": 4}},
     {}),
    ({"server_tool_use": None}, {}),
    ({"server_tool_use": [1]}, {}),
    ({"input_tokens": 3}, {}),
    (None, {}),
    ("usage", {}),
])
def test_anthropic_server_tool_use(usage: Any, calls: dict[str, int]) -> None:
    assert server_tool_calls(usage) == calls


def test_responses_output_items() -> None:
    output: list[Any] = [
        {"type": "web_search_call"}, {"type": "message"}, {"type": "web_search_call"}, {"type": "file_search_call"},
        {"type": "code_interpreter_call"}, {"type": "image_generation_call"}, {"type": "mcp_call"},
        # the client's own calls: run by the client, not billed by the provider
        {"type": "function_call"}, {"type": "custom_tool_call"}, {"type": "computer_call"},
        {"type": "local_shell_call"}, {"type": "shell_call"}, {"type": "apply_patch_call"},
        {"type": 5}, "web_search_call", None, {},
    ]
    assert hosted_tool_calls({"output": output}) == {"web_search": 2, "file_search": 1, "code_interpreter": 1,
                                                     "image_generation": 1, "mcp": 1}
    assert hosted_tool_calls({"output": None}) == {} == hosted_tool_calls({})
    assert hosted_tool_calls({"output": 5}) == {} == hosted_tool_calls({"output": {"type": "web_search_call"}})


@pytest.mark.parametrize("per_tool_call", [{"web_search": -0.01}, {"": 0.01}, {"web_search": "cheap"}, [0.01]])
def test_a_bad_per_call_price_fails_config_load(per_tool_call: Any) -> None:
    with pytest.raises(ConfigError, match="per_tool_call"):
        parse_settings({"prices": {"m": {"per_tool_call": per_tool_call}}}, env={})


def test_per_call_prices_load() -> None:
    settings = parse_settings({"prices": {"m": {"per_tool_call": {"web_search": 0.01}}}}, env={})
    assert settings.prices["m"].per_tool_call == {"web_search": 0.01}
    assert parse_settings({"prices": {"m": {}}}, env={}).prices["m"].per_tool_call == {}
