"""Prices per model (USD per million tokens, and per call of a provider's tool) and the cost of one request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Meter
from gateway.settings import PriceConfig, Settings

# Calls reserved at admission for each priced tool a request enables, where neither the tool
# (Anthropic's ``max_uses``) nor the request (Responses' ``max_tool_calls``) bounds them; settlement
# charges the calls the answer reports, so a request that makes more costs more than it reserved.
TOOL_CALLS_RESERVED = 5


def request_cost(price: PriceConfig, meter: Meter) -> float:
    """What a request cost, in USD, from its meter: the prompt's tokens at the input price but those
    read from the provider's cache (the cached price) and those written to it (the cache write
    prices), the output's at the output price, each at the rates of the service tier the answer says
    it was served at and of the prompt's length, and each call of a priced tool of the provider's."""
    prompt = meter.prompt_tokens
    price = price.for_tier(meter.service_tier).for_prompt(prompt)
    cached = min(meter.cached_tokens, prompt)
    written = min(meter.cache_write_tokens, prompt - cached)
    written_1h = min(meter.cache_write_1h_tokens, written)
    read_rate = price.input_per_million if price.cached_input_per_million is None else price.cached_input_per_million
    write_rate = price.input_per_million if price.cache_write_input_per_million is None \
        else price.cache_write_input_per_million
    write_1h_rate = write_rate if price.cache_write_1h_input_per_million is None \
        else price.cache_write_1h_input_per_million
    tokens = (
        (prompt - cached - written) * price.input_per_million
        + cached * read_rate
        + (written - written_1h) * write_rate
        + written_1h * write_1h_rate
        + meter.completion_tokens * price.output_per_million
    ) / 1_000_000
    if not meter.tool_calls:
        return tokens
    return tokens + sum(price.per_tool_call.get(tool, 0.0) * calls for tool, calls in meter.tool_calls.items())


@dataclass(frozen=True)
class Price:
    input_per_million: float = 0.0
    output_per_million: float = 0.0
    cached_input_per_million: float | None = None
    highest_per_million: float = 0.0  # of every per-token price (cache writes, long prompts', service tiers'):
    # what a reservation takes
    per_tool_call: Mapping[str, float] = field(default_factory=dict, hash=False)  # the highest of each tool's


FREE = Price()  # a model with no price


@dataclass(frozen=True)
class HostedTools:
    """The tools a request enables that its provider runs (and may bill per call): each one's
    ``type`` with its own bound on calls (Anthropic's ``max_uses``; None: none), and the request's
    bound on all of them (Responses' ``max_tool_calls``; None: none)."""

    types: tuple[tuple[str, int | None], ...] = ()
    max_calls: int | None = None

    @classmethod
    def of(cls, tools: Any, max_calls: Any = None) -> HostedTools:
        """From a request's ``tools`` as sent (an entry without a string ``type`` is the client's own)."""
        entries = tools if isinstance(tools, list) else []
        types = tuple((t["type"], _calls(t.get("max_uses"))) for t in entries
                      if isinstance(t, dict) and isinstance(t.get("type"), str))
        return cls(types, _calls(max_calls))


NO_TOOLS = HostedTools()


class PriceTable:
    """Built from the config's ``prices`` section, optionally overlaid with the model_prices table."""

    def __init__(self, prices: dict[str, Price] | None = None) -> None:
        self.prices = dict(prices or {})

    @classmethod
    def from_config(cls, prices: dict[str, PriceConfig]) -> PriceTable:
        return cls({name: _price(p) for name, p in prices.items()})

    @classmethod
    def from_settings(cls, settings: Settings) -> PriceTable:
        """The config's prices; a model group priced only per deployment gets the highest of its
        deployments' prices, and a group priced itself reserves at the highest of its own and its
        deployments' (a request is priced at its deployment's), and of the models its fallbacks may
        hand it to (an answer from a fallback is priced at the fallback's), so reservations (made
        before a deployment is picked) never undershoot."""
        table = cls.from_config(settings.prices)
        for group in settings.models:
            priced = [table.prices[d.id] for d in group.deployments if d.id in table.prices]
            if not priced:
                continue
            highest = max(_highest(p) for p in priced)
            if (own := table.prices.get(group.name)) is not None:
                table.prices[group.name] = replace(own, highest_per_million=max(_highest(own), highest),
                                                   per_tool_call=_highest_per_call([own, *priced]))
            else:
                table.prices[group.name] = Price(
                    max(p.input_per_million for p in priced), max(p.output_per_million for p in priced),
                    highest_per_million=highest, per_tool_call=_highest_per_call(priced),
                )
        table._reserve_for_fallbacks(settings)
        return table

    def _reserve_for_fallbacks(self, settings: Settings) -> None:
        """Raise each model's reservation prices (per token, per tool call) to the highest of every
        model its fallbacks (and theirs, in turn) may serve it with."""
        groups = {name: g for g in settings.models for name in (g.name, *g.aliases)}
        reserved = {g.name: _highest(self.get(g.name)) for g in settings.models}
        own = {g.name: self.get(g.name) for g in settings.models}
        for group in settings.models:
            seen, todo = {group.name}, [*group.fallbacks, *group.context_window_fallbacks]
            while todo:
                if (other := groups.get(todo.pop())) is not None and other.name not in seen:
                    seen.add(other.name)
                    todo += [*other.fallbacks, *other.context_window_fallbacks]
            highest = max(reserved[name] for name in seen)
            per_call = _highest_per_call(own[name] for name in seen)
            if highest > reserved[group.name] or per_call != own[group.name].per_tool_call:
                self.prices[group.name] = replace(self.get(group.name), highest_per_million=highest,
                                                  per_tool_call=per_call)

    def update(self, prices: dict[str, Price]) -> None:
        self.prices.update(prices)

    def get(self, model: str) -> Price:
        return self.prices.get(model, FREE)

    def max_per_million(self, model: str) -> float:
        """The highest per-token price, used to reserve money before the split is known."""
        return _highest(self.get(model))

    def tool_reserve(self, model: str, tools: HostedTools) -> float:
        """The most, in USD, that the calls of ``model``'s priced tools ``tools`` enables may cost: a
        tool whose ``type`` is a priced tool's name or begins with it and ``_`` (``web_search_preview``,
        ``web_search_20250305``: ``web_search``) at that price, for ``max_calls`` calls of the priciest
        of them, else each for its own bound or ``TOOL_CALLS_RESERVED`` calls."""
        priced = self.get(model).per_tool_call
        rates = [(rate, TOOL_CALLS_RESERVED if bound is None else bound) for kind, bound in tools.types
                 if priced and (rate := _tool_rate(priced, kind)) > 0]
        if not rates:
            return 0.0
        if tools.max_calls is not None:
            return tools.max_calls * max(rate for rate, _ in rates)
        return sum(rate * calls for rate, calls in rates)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        p = self.get(model)
        cached = min(cached_tokens, prompt_tokens) if p.cached_input_per_million is not None else 0
        total = (
            (prompt_tokens - cached) * p.input_per_million
            + cached * (p.cached_input_per_million or 0.0)
            + completion_tokens * p.output_per_million
        )
        return total / 1_000_000


def _price(p: PriceConfig) -> Price:
    return Price(p.input_per_million, p.output_per_million, p.cached_input_per_million, max(p.rates()),
                 dict(p.per_tool_call))


def _highest_per_call(prices: Iterable[Price]) -> dict[str, float]:
    """Each tool's highest per-call price among ``prices``."""
    out: dict[str, float] = {}
    for p in prices:
        for tool, rate in p.per_tool_call.items():
            out[tool] = max(out.get(tool, 0.0), rate)
    return out


def _tool_rate(priced: Mapping[str, float], kind: str) -> float:
    return max((rate for name, rate in priced.items() if kind == name or kind.startswith(name + "_")), default=0.0)


def _calls(value: Any) -> int | None:
    """A bound on calls as sent: a count, else (absent, or not a count: the upstream judges it) None."""
    return value if type(value) is int and value >= 0 else None


def _highest(p: Price) -> float:
    return max(p.input_per_million, p.output_per_million, p.highest_per_million)
