"""Deployment-level configuration: what a backend needs to know about one provider endpoint.

These Structs live here, not in ``gateway/settings.py``, so that ``backends/`` never imports the
gateway (the dependency direction is gateway -> backends -> engine). The gateway's Settings embed
them and re-export them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta, Struct

from backends.providers import PROVIDERS

# A timeout or period: positive and finite (``.inf`` would be a timeout that never fires, NaN never
# compares); a day at most, which is longer than any one attempt or circuit period should take.
Seconds = Annotated[float, Meta(gt=0, le=86400)]
# An anthropic-beta value or a server tool type, as Anthropic spells them ("files-api-2025-04-14",
# "web_search_20250305"): no blanks, no commas.
OptInName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# The ``options`` an HTTP provider reads (the engine's are checked when it is built, backends.local.options):
# each with its check and what it must be. Another provider's options are its own affair.
_HTTP_OPTIONS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "openai": {"forward_tenant": (lambda v: isinstance(v, bool), "true or false")},  # to an engine node
    "anthropic": {"max_tokens": (_positive_int, "a positive integer")},  # when a request sets none
}


def _check_http_options(provider: str, options: dict[str, Any]) -> None:
    """An HTTP deployment's options: a typo is an error, not silently ignored (nor ``"no"`` read as true)."""
    known = _HTTP_OPTIONS.get(provider)
    if known is None:
        return
    if unknown := sorted(set(options) - set(known)):
        raise ValueError(f"unknown options {unknown} for provider {provider!r} (known: {sorted(known)})")
    for name, (valid, must) in known.items():
        if name in options and not valid(options[name]):
            raise ValueError(f"options.{name} must be {must}, got {options[name]!r}")


# The user info of a URL (or of what was meant as one: "user:pass@host/v1", no scheme) up to its last "@"
_USER_INFO = re.compile(r"^((?:[^/@]*//)?[^/:@]*):[^/]*@")


def without_password(url: str) -> str:
    """``url`` for messages: the password of its user info (``https://user:pass@host``) masked."""
    return _USER_INFO.sub(r"\1:***@", url, count=1)


_IN_PROCESS = frozenset({"local", "transformers"})  # the providers that run the model here, not over HTTP


class ConfigError(ValueError):
    """Invalid configuration; the message names the key and the problem."""


class Conf(Struct, forbid_unknown_fields=True, kw_only=True):
    """Base for config sections: unknown keys are errors (typos must not pass silently)."""


class Timeouts(Conf):
    """Per attempt (a retry or fallback starts its own clock; a model group's ``timeout`` bounds them
    all together). A non-streaming answer usually comes whole when generation ends, so it is bounded
    by ``total`` alone; a stream by all four."""

    connect: Seconds = 5.0
    first_byte: Seconds = 60.0  # until a stream's response headers and first event
    total: Seconds = 600.0
    # A stream's longest silence after its first event (any line counts, keep-alives too); generous by
    # default, since a reasoning model may think for minutes between two events.
    idle: Seconds = 300.0


class DeploymentConfig(Conf):
    """One provider endpoint serving one upstream model."""

    provider: str  # a name registered in backends.providers
    model: str  # the upstream model name, or a local folder for "local"/"transformers"
    name: str | None = None  # defaults to "<provider>:<model>"
    api_base: str | None = None
    api_key: str | None = None  # use ${ENV_VAR}; never commit a secret
    weight: Annotated[float, Meta(gt=0, le=1e6)] = 1.0  # relative to the group's others: finite
    max_concurrency: Annotated[int, Meta(ge=1)] | None = None
    tokens_per_minute: Annotated[int, Meta(ge=1)] | None = None
    context_window: Annotated[int, Meta(ge=1)] | None = None
    # The upstream model's tokenizer (a tokenizer.json, or a folder holding one): admission counts
    # prompts with it instead of reserving their byte bound (backends.prompt_count).
    tokenizer: str | None = None
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    options: dict[str, Any] = msgspec.field(default_factory=dict)  # provider-specific (engine args)
    # HTTP providers forward every request field; these adjust that for an upstream that rejects some:
    drop_params: list[str] = msgspec.field(default_factory=list)  # top-level fields never sent
    rename_params: dict[str, str] = msgspec.field(default_factory=dict)  # sent under another name
    # The upstream serves OpenAI's Responses API itself: /v1/responses is passed through, not translated.
    responses_api: bool = False
    # What an anthropic deployment's clients may opt into (backends.anthropic_opt_ins); empty: nothing.
    # A server tool's fees are priced by the model's ``per_tool_call`` (a long context's are not); listing
    # "files-api-2025-04-14" lets every tenant of the deployment reference any file uploaded with its key.
    anthropic_betas: list[OptInName] = msgspec.field(default_factory=list)  # anthropic-beta header values
    server_tools: list[OptInName] = msgspec.field(default_factory=list)  # tool types Anthropic runs

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"unknown provider {self.provider!r} (known: {', '.join(sorted(PROVIDERS))})")
        if self.api_base is not None:
            url = urlsplit(self.api_base)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"api_base must be an http(s) URL such as https://api.openai.com/v1, "
                                 f"got {without_password(self.api_base)!r}")
        _check_http_options(self.provider, self.options)
        if self.provider in _IN_PROCESS and (ignored := self._http_only_fields()):
            raise ValueError(f"provider {self.provider!r} runs the model in this process: {', '.join(ignored)} "
                             "(read for HTTP upstreams only) would be ignored")
        if self.provider == "anthropic" and self.responses_api:
            raise ValueError("responses_api applies to openai deployments; anthropic's /v1/responses is translated")
        if self.provider != "anthropic" and (self.anthropic_betas or self.server_tools):
            raise ValueError(f"anthropic_betas and server_tools apply to anthropic deployments only, "
                             f"not to provider {self.provider!r}")

    def _http_only_fields(self) -> list[str]:
        """The fields set that only an HTTP upstream reads."""
        given = {"api_base": self.api_base is not None, "api_key": self.api_key is not None,
                 "drop_params": bool(self.drop_params), "rename_params": bool(self.rename_params),
                 "responses_api": self.responses_api}
        return [name for name, set_ in given.items() if set_]

    @property
    def id(self) -> str:
        return self.name or f"{self.provider}:{self.model}"
