"""Routing policy: deployment health (circuit breakers, latency), strategies, and attempt plans."""
