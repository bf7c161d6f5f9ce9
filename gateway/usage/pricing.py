"""Prices per model (USD per million tokens, and per call of a provider's tool) and the cost of one request."""

from __future__ import annotations

from dataclasses import dataclass, replace

from backends.base import Meter
from gateway.settings import PriceConfig, Settings


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


FREE = Price()  # a model with no price


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
                table.prices[group.name] = replace(own, highest_per_million=max(_highest(own), highest))
            else:
                table.prices[group.name] = Price(
                    max(p.input_per_million for p in priced), max(p.output_per_million for p in priced),
                    highest_per_million=highest,
                )
        table._reserve_for_fallbacks(settings)
        return table

    def _reserve_for_fallbacks(self, settings: Settings) -> None:
        """Raise each model's reservation price to the highest of every model its fallbacks (and
        theirs, in turn) may serve it with."""
        groups = {name: g for g in settings.models for name in (g.name, *g.aliases)}
        reserved = {g.name: _highest(self.get(g.name)) for g in settings.models}
        for group in settings.models:
            seen, todo = {group.name}, [*group.fallbacks, *group.context_window_fallbacks]
            while todo:
                if (other := groups.get(todo.pop())) is not None and other.name not in seen:
                    seen.add(other.name)
                    todo += [*other.fallbacks, *other.context_window_fallbacks]
            highest = max(reserved[name] for name in seen)
            if highest > reserved[group.name]:
                self.prices[group.name] = replace(self.get(group.name), highest_per_million=highest)

    def update(self, prices: dict[str, Price]) -> None:
        self.prices.update(prices)

    def get(self, model: str) -> Price:
        return self.prices.get(model, FREE)

    def max_per_million(self, model: str) -> float:
        """The highest per-token price, used to reserve money before the split is known."""
        return _highest(self.get(model))

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
    return Price(p.input_per_million, p.output_per_million, p.cached_input_per_million, max(p.rates()))


def _highest(p: Price) -> float:
    return max(p.input_per_million, p.output_per_million, p.highest_per_million)
