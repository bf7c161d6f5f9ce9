"""What a request costs from its meter (``request_cost``: cache reads and writes, tool calls, long
prompts' and service tiers' rates), and the price a money reservation takes
(``PriceTable.max_per_million``: the highest per-token price, cache writes and tiers included)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.base import Meter
from gateway.settings import ConfigError, LongPromptPrice, PriceConfig, ServiceTierPrice, parse_settings
from gateway.usage.pricing import TOOL_CALLS_RESERVED, HostedTools, PriceTable, request_cost

FULL = PriceConfig(input_per_million=3.0, output_per_million=15.0, cached_input_per_million=0.3,
                   cache_write_input_per_million=3.75, cache_write_1h_input_per_million=6.0,
                   per_tool_call={"web_search": 0.01})


@pytest.mark.parametrize(("price", "meter", "cost"), [
    # 100 prompt tokens: 20 read from the cache, 30 written to it (10 of them for an hour), 50 plain
    (FULL, Meter(prompt_tokens=100, completion_tokens=10, cached_tokens=20, cache_write_tokens=30,
                 cache_write_1h_tokens=10), (50 * 3 + 20 * 0.3 + 20 * 3.75 + 10 * 6 + 10 * 15) / 1e6),
    # no cache prices: every prompt token at the input price; the 1-hour writes at the write price
    (PriceConfig(input_per_million=2.0, output_per_million=4.0),
     Meter(prompt_tokens=100, completion_tokens=10, cached_tokens=20, cache_write_tokens=30), (100 * 2 + 40) / 1e6),
    (PriceConfig(input_per_million=2.0, cache_write_input_per_million=5.0),
     Meter(prompt_tokens=100, cache_write_tokens=30, cache_write_1h_tokens=30), (70 * 2 + 30 * 5) / 1e6),
    # counts past what they are part of are cut to it: no token is priced twice
    (FULL, Meter(prompt_tokens=10, cached_tokens=8, cache_write_tokens=50, cache_write_1h_tokens=90),
     (8 * 0.3 + 2 * 6) / 1e6),
    # each call of a priced tool; an unpriced tool's calls cost nothing
    (FULL, Meter(tool_calls={"web_search": 3, "web_fetch": 5}), 0.03),
    (PriceConfig(), Meter(prompt_tokens=1000, completion_tokens=1000, tool_calls={"web_search": 3}), 0.0),
])
def test_request_cost(price: PriceConfig, meter: Meter, cost: float) -> None:
    assert request_cost(price, meter) == pytest.approx(cost)


LONG = PriceConfig(input_per_million=3.0, output_per_million=15.0, cached_input_per_million=0.3,
                   long_prompts=[LongPromptPrice(above_tokens=200_000, input_per_million=6.0, output_per_million=22.5),
                                 LongPromptPrice(above_tokens=1_000, input_per_million=4.0)])


@pytest.mark.parametrize(("prompt", "rates"), [
    (1_000, (3.0, 15.0, 0.3)),  # not above the threshold: the model's own prices
    (1_001, (4.0, 15.0, 0.3)),  # the unset prices are the model's own
    (200_000, (4.0, 15.0, 0.3)),
    (200_001, (6.0, 22.5, 0.3)),  # the highest threshold under the prompt
])
def test_a_long_prompt_is_priced_at_its_rates(prompt: int, rates: tuple[float, float, float]) -> None:
    meter = Meter(prompt_tokens=prompt, completion_tokens=100, cached_tokens=10)
    read, plain = 10, prompt - 10
    assert request_cost(LONG, meter) == pytest.approx((plain * rates[0] + 100 * rates[1] + read * rates[2]) / 1e6)


TIERED = PriceConfig(input_per_million=2.0, output_per_million=8.0, cached_input_per_million=0.5,
                     long_prompts=[LongPromptPrice(above_tokens=1_000, input_per_million=4.0)],
                     service_tiers={"priority": ServiceTierPrice(input_per_million=3.5, output_per_million=14.0),
                                    "flex": ServiceTierPrice(output_per_million=4.0, long_prompts=[]),
                                    "scale": ServiceTierPrice(long_prompts=[
                                        LongPromptPrice(above_tokens=500, output_per_million=20.0)])})


@pytest.mark.parametrize(("tier", "prompt", "rates"), [
    (None, 100, (2.0, 8.0, 0.5)),  # no tier said: the model's own prices
    ("default", 100, (2.0, 8.0, 0.5)),  # a tier not listed: the same
    ("priority", 100, (3.5, 14.0, 0.5)),  # the unset prices are the model's own
    ("priority", 1_001, (4.0, 14.0, 0.5)),  # the model's long prompts apply over the tier's prices
    ("flex", 1_001, (2.0, 4.0, 0.5)),  # the tier's own long prompts (none) replace the model's
    ("scale", 501, (2.0, 20.0, 0.5)),
    ("scale", 1_001, (2.0, 20.0, 0.5)),
])
def test_a_request_is_priced_at_its_service_tiers_rates(tier: str | None, prompt: int,
                                                        rates: tuple[float, float, float]) -> None:
    meter = Meter(prompt_tokens=prompt, completion_tokens=100, cached_tokens=10, service_tier=tier)
    expected = ((prompt - 10) * rates[0] + 100 * rates[1] + 10 * rates[2]) / 1e6
    assert request_cost(TIERED, meter) == pytest.approx(expected)


def test_a_tier_is_matched_whatever_the_case_of_its_name() -> None:
    price = parse_settings({"prices": {"m": {"input_per_million": 1.0, "service_tiers": {
        "Priority": {"input_per_million": 2.0}}}}}, env={}).prices["m"]
    for tier in ("priority", "PRIORITY"):
        assert request_cost(price, Meter(prompt_tokens=1_000_000, service_tier=tier)) == pytest.approx(2.0)


def test_a_reservation_takes_the_highest_per_token_price_cache_writes_included() -> None:
    dep: dict[str, Any] = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:9/v1"}
    settings = parse_settings({
        "models": [{"name": "g", "deployments": [dep | {"name": "a"}, dep | {"name": "b"}]}],
        "prices": {"m": {"input_per_million": 1, "output_per_million": 2, "cache_write_1h_input_per_million": 6},
                   "n": {"input_per_million": 1, "output_per_million": 8, "cache_write_input_per_million": 5},
                   "a": {"input_per_million": 1, "output_per_million": 2},
                   "b": {"input_per_million": 1, "output_per_million": 2, "cache_write_input_per_million": 7},
                   "long": {"input_per_million": 1, "output_per_million": 2,
                            "long_prompts": [{"above_tokens": 1000, "output_per_million": 9}]},
                   "tiered": {"input_per_million": 1, "output_per_million": 2, "service_tiers": {
                       "priority": {"output_per_million": 4,
                                    "long_prompts": [{"above_tokens": 1000, "output_per_million": 11}]}}}},
    }, env={})  # fmt: skip
    table = PriceTable.from_settings(settings)
    assert table.max_per_million("m") == 6.0 and table.max_per_million("n") == 8.0
    assert table.max_per_million("g") == 7.0  # the group priced by its deployments: the dearest of them
    assert table.max_per_million("long") == 9.0
    assert table.max_per_million("tiered") == 11.0  # a service tier's prices, its long prompts' included


def test_a_reservation_covers_every_model_a_fallback_may_serve_it_with() -> None:
    """An answer from a fallback is priced at the fallback's price: a model reserves at the highest
    of those its fallbacks reach (theirs in turn, through aliases, past a cycle), so a cost budget
    is never passed by a request it admitted."""
    dep: dict[str, Any] = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:9/v1"}
    settings = parse_settings({
        "models": [{"name": "cheap", "deployments": [dep], "fallbacks": ["mid"]},
                   {"name": "mid", "deployments": [dep], "context_window_fallbacks": ["big"], "fallbacks": ["cheap"]},
                   {"name": "dear", "aliases": ["big"], "deployments": [dep]},
                   {"name": "free", "deployments": [dep], "fallbacks": ["dear"]},
                   {"name": "alone", "deployments": [dep]}],
        "prices": {"cheap": {"input_per_million": 1, "output_per_million": 2},
                   "mid": {"input_per_million": 3, "output_per_million": 4},
                   "dear": {"input_per_million": 10, "output_per_million": 30},
                   "alone": {"input_per_million": 1, "output_per_million": 5}},
    }, env={})  # fmt: skip
    table = PriceTable.from_settings(settings)
    assert [table.max_per_million(m) for m in ("cheap", "mid", "dear", "free", "alone")] == [30, 30, 30, 30, 5]
    assert table.cost("cheap", 1_000_000, 0) == 1.0 and table.cost("free", 1_000_000, 0) == 0.0  # own prices


def test_a_reservation_covers_the_calls_of_the_priced_tools_a_request_enables() -> None:
    """A priced tool's type (or one that begins with its name and ``_``) reserves its highest price
    among the model's deployments and fallbacks, for the request's max_tool_calls calls of the
    priciest, else each for its max_uses or TOOL_CALLS_RESERVED calls; other tools reserve nothing."""
    dep: dict[str, Any] = {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:9/v1"}
    settings = parse_settings({
        "models": [{"name": "m", "deployments": [dep | {"name": "a"}, dep | {"name": "b"}], "fallbacks": ["f"]},
                   {"name": "f", "deployments": [dep]}, {"name": "plain", "deployments": [dep]}],
        "prices": {"a": {"per_tool_call": {"web_search": 0.01}}, "b": {"per_tool_call": {"web_search": 0.02}},
                   "f": {"per_tool_call": {"web_fetch": 0.05}}},
    }, env={})  # fmt: skip
    table = PriceTable.from_settings(settings)
    search, fetch = [{"type": "web_search_preview"}], [{"type": "web_fetch_20250910", "max_uses": 1}]
    assert table.tool_reserve("m", HostedTools.of(search)) == pytest.approx(TOOL_CALLS_RESERVED * 0.02)
    assert table.tool_reserve("m", HostedTools.of(search + fetch)) == pytest.approx(TOOL_CALLS_RESERVED * 0.02 + 0.05)
    assert table.tool_reserve("m", HostedTools.of(search + fetch, 3)) == pytest.approx(3 * 0.05)
    assert table.tool_reserve("m", HostedTools.of([{"type": "function"}, {"type": "web_searches"}, "x"])) == 0.0
    assert table.tool_reserve("plain", HostedTools.of(search)) == 0.0


@pytest.mark.parametrize(("price", "field"), [
    ({"cache_write_input_per_million": -1}, "cache_write_input_per_million"),
    ({"cache_write_1h_input_per_million": -1}, "cache_write_1h_input_per_million"),
    ({"long_prompts": [{"above_tokens": 0, "input_per_million": 1}]}, "above_tokens"),
    ({"long_prompts": [{"input_per_million": 1}]}, "above_tokens"),
    ({"long_prompts": [{"above_tokens": 10, "output_per_million": -2}]}, "output_per_million"),
    ({"long_prompts": [{"above_tokens": 10, "per_tool_call": {}}]}, "per_tool_call"),
    ({"service_tiers": {"priority": {"input_per_million": -1}}}, "input_per_million"),
    ({"service_tiers": {"priority": {"above_tokens": 10}}}, "above_tokens"),
    ({"service_tiers": {"": {"input_per_million": 1}}}, "service_tiers"),
    ({"service_tiers": {"flex": {"long_prompts": [{"input_per_million": 1}]}}}, "above_tokens"),
])
def test_a_bad_price_fails_config_load(price: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_settings({"prices": {"m": price}}, env={})
