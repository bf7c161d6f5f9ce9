"""Switchyard gateway: the OpenAI-compatible HTTP surface and every business rule."""
