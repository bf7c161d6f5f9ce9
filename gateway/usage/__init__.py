"""Metering: prices, the batched usage writer and its local journal, usage reports."""

from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter

__all__ = ["Price", "PriceTable", "UsageWriter"]
