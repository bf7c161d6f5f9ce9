"""Typed settings, loaded from YAML.

- ``${VAR}`` and ``${VAR:-default}`` in any string value are replaced from the environment, so
  secrets stay out of config files. An unset ``${VAR}`` without a default is an error naming it.
- Environment variables ``SWITCHYARD__SECTION__KEY=value`` override keys after loading
  (the value is parsed as a YAML scalar: ``SWITCHYARD__SERVER__PORT=9000``; a number or a date
  stays text where the key takes text, so that a secret of digits is not an error).
- Validation errors name the offending key and where it was set (the file, or the environment
  variable that overrode it): ``config error at models[0].deployments[1].weight (in prod.yaml)``;
  a key given twice in one mapping, a fallback naming no model and a deployment named twice in one
  model are errors too.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml
from msgspec import Meta

# Deployment-level config lives in backends/ (gateway -> backends); re-exported here for callers.
from backends.config import Conf, ConfigError, DeploymentConfig, Seconds, Timeouts
from gateway import trusted_proxies
from gateway.settings_keys import name_keys

log = logging.getLogger("switchyard.settings")
# set by ``switchyard serve`` once it has loaded the config and warned of what it found: the app
# factory (in the same process with one worker, in each worker with several) then loads it quietly
CONFIG_WARNED_ENV = "SWITCHYARD_CONFIG_WARNED"

__all__ = ["ConfigError", "DeploymentConfig", "Settings", "Timeouts", "load_settings", "parse_settings"]

ENV_PREFIX = "SWITCHYARD__"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(.+)`$")


class _Invalid(Exception):
    """A problem at one key; ``parse_settings`` turns it into a ConfigError naming where the key was set."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where, self.problem = where, problem


class ServerConfig(Conf):
    host: Annotated[str, Meta(min_length=1)] = "127.0.0.1"  # "" would bind every interface
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 4 * 1024 * 1024
    workers: Annotated[int, Meta(ge=1)] = 1
    # Slow-loris guards (``switchyard serve``): seconds a client may take for a request's line and
    # headers, then for its whole body (answered 408 after); connections one client address may
    # hold open at once (0: no cap; more are answered 429), the TCP peer's, a trusted proxy's too.
    header_timeout: Annotated[float, Meta(gt=0, le=3600)] = 10.0
    body_timeout: Annotated[float, Meta(gt=0, le=3600)] = 30.0
    max_connections_per_client: Annotated[int, Meta(ge=0, le=1_000_000)] = 256
    # SIGTERM (gateway.drain): /readyz fails at once; the listener closes ``drain_readiness_seconds``
    # later; requests in flight then have ``drain_seconds`` to finish before streams still running
    # are ended (finish_reason "length", usage) and settled.
    drain_readiness_seconds: Annotated[float, Meta(ge=0, le=600)] = 0.0
    drain_seconds: Annotated[float, Meta(ge=0, le=3600)] = 10.0
    # A started stream that wrote its client nothing for this long gets a keep-alive (an SSE comment;
    # a ``ping`` event under /v1/messages) after 1x to 2x as long, and again while silent (gateway.keepalive).
    # 0 or null: none.
    stream_keepalive_seconds: Annotated[float, Meta(ge=0, le=3600)] | None = 15.0
    # Peers (IP addresses, CIDR networks, or "*" alone; one may be given as a string) whose
    # X-Forwarded-For names the client (gateway.trusted_proxies); applied at start, for every worker.
    trusted_proxies: list[str] | str = msgspec.field(default_factory=lambda: list(trusted_proxies.LOOPBACK))

    def __post_init__(self) -> None:
        if isinstance(self.trusted_proxies, str):
            self.trusted_proxies = [self.trusted_proxies]
        trusted_proxies.check(self.trusted_proxies)


class DatabaseConfig(Conf):
    url: str = "sqlite+aiosqlite:///var/switchyard.db"

    def __post_init__(self) -> None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        from gateway.db.engine import normalise_url

        scheme = self.url.partition("://")[0]
        try:
            make_url(self.url).get_dialect()
            parsed = normalise_url(self.url)  # the driver the gateway will use
            dialect = parsed.get_dialect(_is_async=True)  # as create_async_engine picks it
        except NoSuchModuleError:
            raise ValueError(f"database.url has an unknown dialect or driver {scheme!r} "
                             "(e.g. postgresql+asyncpg, sqlite+aiosqlite)") from None
        except ArgumentError:  # after its subclass above
            raise ValueError("database.url is not a URL (dialect+driver://user:password@host/name)") from None
        if parsed.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"database.url must name SQLite or PostgreSQL, got {scheme!r} "
                             "(e.g. sqlite+aiosqlite://, postgresql+asyncpg://)")
        if not dialect.is_async:
            raise ValueError(f"database.url names driver {parsed.drivername!r}, which has no asyncio support; "
                             "use postgresql+asyncpg:// or sqlite+aiosqlite://")
        try:  # a dialect SQLAlchemy knows may need a package that is not installed
            dialect.import_dbapi()
        except ImportError as exc:
            raise ValueError(f"database.url names driver {parsed.drivername!r}, which is not installed ({exc}); "
                             "use postgresql+asyncpg:// or sqlite+aiosqlite://") from None


class RedisConfig(Conf):
    url: str | None = None  # None: the in-process quota store (embedded default)
    on_unavailable: Literal["fail_closed", "fail_open"] = "fail_closed"

    def __post_init__(self) -> None:
        scheme = (self.url or "redis:").partition(":")[0]
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"redis.url has scheme {scheme!r}; it must be redis://, rediss:// or unix://")


class AuthConfig(Conf):
    admin_key: str | None = None  # a bootstrap admin key (use ${ENV}); tenants' keys live in SQL
    key_cache_seconds: Annotated[float, Meta(ge=0, le=5)] = 2.0
    # Failed authentications (wrong, revoked or expired keys; failed dashboard sign-ins) one client
    # address, and one key prefix, may make within a window of ``failure_window`` seconds that
    # starts at the first; beyond, 429 with Retry-After until it ends (0: no cap). Shared through
    # Redis when ``redis.url`` is set.
    max_failures_per_address: Annotated[int, Meta(ge=0, le=1_000_000)] = 30
    max_failures_per_prefix: Annotated[int, Meta(ge=0, le=1_000_000)] = 10
    failure_window: Annotated[float, Meta(gt=0, le=86400)] = 300.0
    # A key's use from one client address is audited at most once per this many seconds (per process).
    key_use_audit_seconds: Annotated[float, Meta(ge=0, le=86400)] = 3600.0
    audit_retention_days: Annotated[float, Meta(gt=0, le=36500)] = 90.0  # older audit events are deleted


class CircuitConfig(Conf):
    """Per-deployment circuit breaker: open after ``failures`` within ``window``, retry after ``cooldown``."""

    failures: Annotated[int, Meta(ge=1)] = 5
    window: Seconds = 30.0
    cooldown: Seconds = 30.0


class ModelGroupConfig(Conf):
    """A public model name and the deployments behind it."""

    name: Annotated[str, Meta(min_length=1)]
    deployments: Annotated[list[DeploymentConfig], Meta(min_length=1)]
    aliases: list[Annotated[str, Meta(min_length=1)]] = msgspec.field(default_factory=list)
    strategy: Literal["weighted", "least_busy", "lowest_latency", "priority", "cache_aware"] = "weighted"
    fallbacks: list[str] = msgspec.field(default_factory=list)
    context_window_fallbacks: list[str] = msgspec.field(default_factory=list)
    max_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    retry_backoff: Annotated[float, Meta(ge=0, le=30)] = 0.25  # seconds; doubled per retry, jittered
    # seconds from a request's first attempt to its answer (a stream's first chunk), retries, waits and
    # fallbacks included (they inherit it: their own ``timeout`` is not read then); None: no such limit
    timeout: Seconds | None = None
    circuit: CircuitConfig = msgspec.field(default_factory=CircuitConfig)
    owned_by: str = "switchyard"


class QuotasConfig(Conf):
    # Chat requests that set no max_tokens are sent upstream with this cap (as
    # max_completion_tokens) and reserved at it, so admission's reservation bounds what they can
    # spend; null sends them uncapped (the reservation then assumes 1024 output tokens). Text
    # completions get their API's own default, 16 (this cap where lower), as max_tokens.
    default_max_tokens: Annotated[int, Meta(ge=1)] | None = 1024
    # A concurrency slot is a lease of this many seconds, renewed by the live replica every third
    # of it: the slots of a replica that died free themselves within one lease.
    lease_seconds: Annotated[float, Meta(ge=1, le=3600)] = 30.0
    # With Redis: a key admitted at 20 or more requests a second is counted in Redis once a second
    # for the next second's worth (credit, gateway/quotas/credit.py) instead of once a request;
    # false counts every request in Redis as it comes.
    credit: bool = True


class UsageConfig(Conf):
    journal_dir: str = "var/usage-journal"  # where usage records wait while the database is down
    # Each usage record is written to a file there before the response's last byte (a killed or
    # crashed gateway process loses none) and fsynced by a background thread within
    # fsync_interval_ms (what a power loss or a kernel crash can lose). The fsyncs cost CPU on the
    # gateway's core: on a 2-core virtual machine (bench.gateway_ab (a), a busy worker) 50 ms
    # instead of 10 took 3 % less CPU per request, 100 ms 5.5 % less, and no fsync at all 4.3 %.
    fsync_interval_ms: Annotated[float, Meta(ge=1, le=60_000)] = 10.0
    # true: the last byte also waits for that fsync, so that a power loss or a kernel crash loses
    # none either (one fsync serves all the requests finishing together; about half a millisecond
    # to a millisecond of latency).
    sync_before_reply: bool = False
    # how often the gateway asks the upstreams how the background responses (``background: true``)
    # nobody polls stand, so that each is metered soon after it ends (at most 16 of them a pass)
    background_poll_seconds: Annotated[float, Meta(gt=0, le=3600)] = 30.0


class TelemetryConfig(Conf):
    """/metrics, OpenTelemetry traces and structured logs (gateway.telemetry)."""

    metrics: bool = True  # serve GET /metrics (Prometheus text format)
    tracing: bool = False  # record OpenTelemetry spans
    # OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces
    otlp_endpoint: Annotated[str, Meta(pattern=r"^https?://[^/\s]+")] | None = None
    service_name: str = "switchyard"
    json_logs: bool = False  # one JSON object per log line, with request id, tenant, model, status, latency


class DashboardConfig(Conf):
    enabled: bool = True
    session_seconds: Annotated[float, Meta(gt=0, le=100 * 365 * 86400)] = 8 * 3600.0  # the cookie's max-age: finite
    secure_cookies: bool = False  # set the Secure flag (serve the dashboard over HTTPS)
    session_secret: str | None = None  # signs session cookies (use ${ENV}); needed with several workers


# USD per million tokens, or per call: finite (.inf would make every cost infinite)
Rate = Annotated[float, Meta(ge=0, le=1e12)]


class TierRates(Conf):
    """Per-token prices that replace a model's own for some requests: a price left unset is the model's own."""

    input_per_million: Rate | None = None
    output_per_million: Rate | None = None
    cached_input_per_million: Rate | None = None
    cache_write_input_per_million: Rate | None = None
    cache_write_1h_input_per_million: Rate | None = None


class LongPromptPrice(TierRates, kw_only=True):
    """The prices of a request whose prompt has more than ``above_tokens`` tokens (Anthropic's
    long-context and Gemini's long-prompt rates)."""

    above_tokens: Annotated[int, Meta(ge=1)]


class ServiceTierPrice(TierRates):
    """The prices of a request the provider says it served at a service tier (OpenAI's ``service_tier``
    ``priority`` or ``flex``, Anthropic's ``usage.service_tier``). Its ``long_prompts`` replace the
    model's own; unset, the model's own apply over these prices."""

    long_prompts: list[LongPromptPrice] | None = None


class PriceConfig(Conf):
    input_per_million: Rate = 0.0
    output_per_million: Rate = 0.0
    cached_input_per_million: Rate | None = None
    # prompt tokens written to the provider's prompt cache (Anthropic's cache_creation_input_tokens);
    # None: at the input price. The 1-hour cache's writes; None: at the cache write price.
    cache_write_input_per_million: Rate | None = None
    cache_write_1h_input_per_million: Rate | None = None
    # USD per call of a tool the provider runs and bills per call, as its answer reports the calls:
    # {web_search: 0.01} (Anthropic's usage.server_tool_use, a Responses web_search_call item)
    per_tool_call: dict[Annotated[str, Meta(min_length=1)], Rate] = msgspec.field(
        default_factory=dict)
    # other per-token prices for longer prompts; the one with the highest threshold under the prompt applies
    long_prompts: list[LongPromptPrice] = msgspec.field(default_factory=list)
    # other prices by the service tier the answer says it was served at ({priority: {...}, flex: {...}})
    service_tiers: dict[Annotated[str, Meta(min_length=1)], ServiceTierPrice] = msgspec.field(
        default_factory=dict)

    def __post_init__(self) -> None:
        self.service_tiers = {name.lower(): prices for name, prices in self.service_tiers.items()}

    def for_tier(self, tier: str | None) -> PriceConfig:
        """The prices of a request served at service tier ``tier`` (its name in any case): a listed
        tier's, else these."""
        prices = self.service_tiers.get(tier.lower()) if tier is not None else None
        if prices is None:
            return self
        long_prompts = self.long_prompts if prices.long_prompts is None else prices.long_prompts
        return msgspec.structs.replace(self, **_set_rates(prices), long_prompts=long_prompts, service_tiers={})

    def for_prompt(self, prompt_tokens: int) -> PriceConfig:
        """The prices of a request with a prompt of ``prompt_tokens``: these, or a long prompt's."""
        tiers = [t for t in self.long_prompts if prompt_tokens > t.above_tokens]
        if not tiers:
            return self
        tier = max(tiers, key=lambda t: t.above_tokens)
        return msgspec.structs.replace(self, **_set_rates(tier), long_prompts=[])

    def rates(self) -> list[float]:
        """Every per-token price these prices may charge, the long prompts' and service tiers' included."""
        priced = [self, *self.long_prompts]
        for tier in self.service_tiers.values():
            priced += [tier, *(tier.long_prompts or ())]
        return [r for p in priced for f in _TIER_RATES if (r := getattr(p, f)) is not None]


_TIER_RATES = ("input_per_million", "output_per_million", "cached_input_per_million", "cache_write_input_per_million",
               "cache_write_1h_input_per_million")


def _set_rates(rates: TierRates) -> dict[str, float]:
    return {f: v for f in _TIER_RATES if (v := getattr(rates, f)) is not None}


class Settings(Conf):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    database: DatabaseConfig = msgspec.field(default_factory=DatabaseConfig)
    redis: RedisConfig = msgspec.field(default_factory=RedisConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    models: list[ModelGroupConfig] = msgspec.field(default_factory=list)
    prices: dict[str, PriceConfig] = msgspec.field(default_factory=dict)
    quotas: QuotasConfig = msgspec.field(default_factory=QuotasConfig)
    usage: UsageConfig = msgspec.field(default_factory=UsageConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    dashboard: DashboardConfig = msgspec.field(default_factory=DashboardConfig)


def _check_references(settings: Settings) -> None:
    """What one key cannot say alone: model names and deployment names unique, fallbacks known."""
    names: set[str] = set()
    # a deployment's name keys its price and metrics: named in several models, it must call one upstream
    upstreams: dict[str, tuple[str, tuple[str, str, str | None]]] = {}
    for i, group in enumerate(settings.models):
        for where, name in (("name", group.name), *((f"aliases[{j}]", a) for j, a in enumerate(group.aliases))):
            if name in names:
                raise _Invalid(f"models[{i}].{where}", f"model name {name!r} is defined twice")
            names.add(name)
        ids: set[str] = set()
        for j, dep in enumerate(group.deployments):
            if dep.id in ids:
                raise _Invalid(f"models[{i}].deployments[{j}]", f"deployment {dep.id!r} is defined twice in "
                               f"model {group.name!r} (give each its own name)")
            ids.add(dep.id)
            if not dep.name:  # an unnamed one's id is its provider and model: the same upstream model
                continue
            upstream = (dep.provider, dep.model, dep.api_base)
            where, first = upstreams.setdefault(dep.name, (f"models[{i}].deployments[{j}]", upstream))
            if first != upstream:
                raise _Invalid(f"models[{i}].deployments[{j}]", f"deployment {dep.id!r} is defined twice with "
                               f"different upstreams ({where} and here): give each its own name")
    for i, group in enumerate(settings.models):
        for key in ("fallbacks", "context_window_fallbacks"):
            for j, name in enumerate(getattr(group, key)):
                if name not in names:
                    raise _Invalid(f"models[{i}].{key}[{j}]", f"unknown model {name!r}")
                if name in (group.name, *group.aliases):  # the router never enters a group twice: ignored
                    raise _Invalid(f"models[{i}].{key}[{j}]", f"model {group.name!r} falls back to itself")


def _warn_of_unused_prices(settings: Settings) -> None:
    """A price applies to a model's name or a deployment's; any other key (an alias, a typo) prices nothing.
    Not an error: prices of models served elsewhere may be kept in one file (they fill model_prices)."""
    names = {name for g in settings.models for name in (g.name, *g.aliases)}
    priced = {g.name for g in settings.models} | {d.id for g in settings.models for d in g.deployments}
    for key in sorted(settings.prices.keys() - priced):
        log.warning("prices.%s names no model or deployment of this config: requests are not priced by it%s", key,
                    " (prices go by the model's name, not an alias)" if key in names else "")


def _interpolate(value: Any, path: str, env: dict[str, str]) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise _Invalid(path or "<root>", f"environment variable {name} is not set")

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{path}[{i}]", env) for i, v in enumerate(value)]
    return value


def _apply_env_overrides(raw: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """Apply the ``SWITCHYARD__`` variables to ``raw``; returns the keys they set ("server.port")
    and the variable that set each."""
    overridden: dict[str, str] = {}
    for var, text in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        keys = [k.lower() for k in var[len(ENV_PREFIX) :].split("__") if k]
        if not keys:
            continue
        node = raw
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config error at {'.'.join(keys)}: environment variable {var} is not a YAML value "
                              f"({_yaml_problem(exc)})") from None
        # msgspec's lax conversion reads a number from its text where the key takes a number
        node[keys[-1]] = text if isinstance(value, int | float | date) and not isinstance(value, bool) else value
        overridden[".".join(keys)] = var
    return overridden


def _located(error: _Invalid, source: str | None, overridden: dict[str, str]) -> ConfigError:
    """The one-line error for a problem at a key: it names the environment variable that set the
    key (or a section above it, or a key under it), else the file."""
    key = error.where.replace("[", ".").replace("]", "")
    if unknown := _UNKNOWN_FIELD.match(error.problem):
        key = unknown.group(1) if key == "<root>" else f"{key}.{unknown.group(1)}"
    var = next((v for k, v in overridden.items() if f"{k}.".startswith(f"{key}.") or f"{key}.".startswith(f"{k}.")),
               None)
    where = f" (set by environment variable {var})" if var else f" (in {source})" if source else ""
    return ConfigError(f"config error at {error.where}{where}: {error.problem}")


def _path_of(msg: str) -> tuple[str, str]:
    """Split msgspec's "Expected ... - at `$.a.b[0]`" into (problem, "a.b[0]")."""
    problem, sep, where = msg.rpartition(" - at `")
    if not sep:
        return msg, "<root>"
    return problem, where.rstrip("`").removeprefix("$.").removeprefix("$") or "<root>"


def _failure(raw: Any) -> str | None:
    """Where ``raw`` fails to convert to Settings (None: it does not)."""
    try:
        msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        return _path_of(str(exc))[1]
    return None


def parse_settings(raw: Any, env: dict[str, str] | None = None, source: str | Path | None = None,
                   warn: bool = True) -> Settings:
    """Settings from a parsed YAML document; errors name ``source`` (the file) where it is given.
    ``warn``: log what is allowed but likely a mistake (prices that price nothing)."""
    env = dict(os.environ) if env is None else env
    if raw is None:
        raw = {}
    overridden: dict[str, str] = {}
    try:
        if not isinstance(raw, dict):
            raise _Invalid("<root>", "expected a mapping of sections")
        raw = _interpolate(raw, "", env)
        overridden = _apply_env_overrides(raw, env)
        try:
            settings = msgspec.convert(raw, Settings, strict=False)
        except msgspec.ValidationError as exc:
            problem, where = _path_of(str(exc))
            raise _Invalid(name_keys(raw, where, _failure), problem) from None
        _check_references(settings)
    except _Invalid as exc:
        raise _located(exc, None if source is None else str(source), overridden) from None
    if warn:
        _warn_of_unused_prices(settings)
    return settings


def load_settings(path: str | Path | None = None, env: dict[str, str] | None = None, warn: bool = True) -> Settings:
    """Load settings from ``path`` (default: $SWITCHYARD_CONFIG or config/default.yaml); ``warn``: as
    ``parse_settings``."""
    env = dict(os.environ) if env is None else env
    path = Path(path or env.get("SWITCHYARD_CONFIG") or "config/default.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    return parse_settings(raw, env, path, warn)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error, not the last one winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: where (line and column, from 1) and what."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem is not None:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return where + exc.problem
    return " ".join(str(exc).split())
