"""The providers a deployment may name: registered here, and only here.

Each maps to ``"module:callable"``, a builder taking the ``DeploymentConfig``. ``DeploymentConfig``
checks a deployment's ``provider`` against this table, and ``backends.factory`` imports the builder
lazily, so a gateway that only talks to HTTP upstreams never imports torch.
"""

from __future__ import annotations

PROVIDERS: dict[str, str] = {
    "openai": "backends.openai_http:OpenAIHTTPBackend",  # any OpenAI-compatible HTTP API
    "anthropic": "backends.anthropic:AnthropicBackend",  # Anthropic's Messages API
    "local": "backends.local:build_backend",  # the in-process engine
    "transformers": "backends.transformers_generate:build_backend",  # plain transformers generate
}


def register_provider(name: str, target: str) -> None:
    """Register (or replace) a provider as ``"module:callable"``."""
    PROVIDERS[name] = target
