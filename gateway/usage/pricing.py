"""Prices per model (USD per million tokens) and the cost of one request."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import PriceConfig, Settings


@dataclass(frozen=True)
class Price:
    input_per_million: float = 0.0
    output_per_million: float = 0.0
    cached_input_per_million: float | None = None


FREE = Price()  # a model with no price


class PriceTable:
    """Built from the config's ``prices`` section, optionally overlaid with the model_prices table."""

    def __init__(self, prices: dict[str, Price] | None = None) -> None:
        self.prices = dict(prices or {})

    @classmethod
    def from_config(cls, prices: dict[str, PriceConfig]) -> PriceTable:
        return cls(
            {
                name: Price(p.input_per_million, p.output_per_million, p.cached_input_per_million)
                for name, p in prices.items()
            }
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> PriceTable:
        """The config's prices; a model group priced only per deployment gets the highest of its
        deployments' prices, so reservations (made before a deployment is picked) never undershoot."""
        table = cls.from_config(settings.prices)
        for group in settings.models:
            if group.name in table.prices:
                continue
            priced = [table.prices[d.id] for d in group.deployments if d.id in table.prices]
            if priced:
                table.prices[group.name] = Price(
                    max(p.input_per_million for p in priced), max(p.output_per_million for p in priced)
                )
        return table

    def update(self, prices: dict[str, Price]) -> None:
        self.prices.update(prices)

    def get(self, model: str) -> Price:
        return self.prices.get(model, FREE)

    def max_per_million(self, model: str) -> float:
        """The highest per-token price, used to reserve money before the split is known."""
        p = self.get(model)
        return max(p.input_per_million, p.output_per_million)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        p = self.get(model)
        cached = min(cached_tokens, prompt_tokens) if p.cached_input_per_million is not None else 0
        total = (
            (prompt_tokens - cached) * p.input_per_million
            + cached * (p.cached_input_per_million or 0.0)
            + completion_tokens * p.output_per_million
        )
        return total / 1_000_000
