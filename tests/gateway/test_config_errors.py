"""A config file an operator got wrong ends in one line that names the key (or the line) and what is
wrong with it: YAML syntax, a key given twice, an environment override that is not YAML, two
deployments of one model under one name, a fallback naming no model."""

from __future__ import annotations

import re
from importlib.util import find_spec
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from gateway.settings import ConfigError, load_settings, parse_settings

DEP = {"provider": "openai", "model": "m", "api_base": "http://127.0.0.1:9/v1"}


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env or {})
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_bad_yaml_is_one_line_with_its_line_and_column(tmp_path: Path) -> None:
    message = _load(tmp_path, "server:\n  port: 8000\nmodels: [{name: a, deployments: []\n")
    assert "is not valid YAML: line 4, column 1: expected ',' or '}', but got '<stream end>'" in message, message
    message = _load(tmp_path, "models:\n\t- name: a\n")
    assert "line 2, column 1: found character '\\t' that cannot start any token" in message, message


def test_a_key_given_twice_is_an_error_not_the_last_one_winning(tmp_path: Path) -> None:
    models = "models:\n  - name: a\n    deployments: [{provider: openai, model: m}]\n"
    assert "line 5, column 1: key 'models' is given twice" in _load(tmp_path, models + "auth: {}\nmodels: []\n")
    assert "key 'port' is given twice" in _load(tmp_path, "server: {port: 1, host: h, port: 2}\n")
    # a merge key's values are overridden, as YAML means them to be
    path = tmp_path / "merge.yaml"
    path.write_text("x-base: &base {host: h, port: 1}\nserver: {<<: *base, port: 2}\n")
    with pytest.raises(ConfigError, match="unknown field `x-base`"):  # parsed; only the section is unknown
        load_settings(path, env={})


def test_an_env_override_that_is_not_yaml_names_the_key_and_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({}, env={"SWITCHYARD__SERVER__PORT": "[1"})
    assert str(caught.value).startswith("config error at server.port: environment variable "
                                        "SWITCHYARD__SERVER__PORT is not a YAML value (")


def test_two_deployments_of_one_model_need_their_own_names() -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[1\]: deployment 'openai:m' is defined twice"):
        parse_settings({"models": [{"name": "a", "deployments": [DEP, DEP]}]}, env={})
    # named apart they are two deployments; one deployment may serve two models
    parse_settings({"models": [{"name": "a", "deployments": [DEP, DEP | {"name": "second"}]},
                               {"name": "b", "deployments": [DEP]}]}, env={})


def test_a_model_name_given_twice_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config error at models\[1\]\.aliases\[0\]: model name 'a' is defined"):
        parse_settings({"models": [{"name": "a", "deployments": [DEP]},
                                   {"name": "b", "aliases": ["a"], "deployments": [DEP]}]}, env={})


def test_the_admin_cli_reports_a_bad_config_file_as_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models: [\n")
    done = CliRunner().invoke(app, ["tenant", "list", "--config", str(path)])
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: config file ") and "is not valid YAML: line 2" in lines[0], lines[0]


def test_a_price_naming_no_model_or_deployment_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    """Prices go by a model's or a deployment's name: one keyed by an alias or a typo prices nothing."""
    raw = {"models": [{"name": "a", "aliases": ["a-latest"], "deployments": [DEP | {"name": "a-east"}]}],
           "prices": {name: {"input_per_million": 1.0} for name in ("a", "a-east", "a-latest", "typo")}}
    with caplog.at_level("WARNING", logger="switchyard.settings"):
        parse_settings(raw)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert warned[0].startswith("prices.a-latest names no model or deployment") and "not an alias" in warned[0]
    assert warned[1].startswith("prices.typo names no model or deployment") and "alias" not in warned[1]


@pytest.mark.parametrize(("model", "where"), [
    ({"name": ""}, "models[0].name"),
    ({"name": "a", "aliases": [""]}, "models[0].aliases[0]"),
    ({"name": "a", "deployments": [DEP | {"weight": float("inf")}]}, "models[0].deployments[0].weight"),
])
def test_an_empty_model_name_or_an_infinite_weight_is_an_error_naming_it(model: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError, match=rf"config error at {re.escape(where)}"):
        parse_settings({"models": [{"deployments": [DEP]} | model]})


@pytest.mark.parametrize(("section", "named"), [
    ({"redis": {"url": "localhost:6379"}}, "redis.url has scheme 'localhost'"),
    ({"database": {"url": "postgres://u@h/db"}}, "database.url has an unknown dialect or driver 'postgres'"),
    ({"database": {"url": "nonsense"}}, "database.url is not a URL"),
    # dialects SQLAlchemy knows that the gateway cannot use: once a ModuleNotFoundError at start-up (exit 1)
    ({"database": {"url": "mysql://u@h/db"}}, "database.url must name SQLite or PostgreSQL, got 'mysql'"),
    ({"database": {"url": "postgresql+pg8000://u@h/db"}},
     "database.url names driver 'postgresql+pg8000', which has no asyncio support"),
    pytest.param({"database": {"url": "postgresql+psycopg://u@h/db"}},
                 "database.url names driver 'postgresql+psycopg', which is not installed (No module named 'psycopg')",
                 marks=pytest.mark.skipif(find_spec("psycopg") is not None, reason="psycopg is installed")),
])
def test_a_bad_redis_or_database_url_is_a_config_error_naming_the_key(section: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        parse_settings(section, env={})


@pytest.mark.parametrize("base", ["not a url", "api.openai.com/v1", "ftp://h/v1", "http://"])
def test_an_api_base_that_is_no_http_url_is_a_config_error(base: str) -> None:
    """Caught at load (or reload), not when the first request fails."""
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[0\]: api_base must be an http\(s\) URL"):
        parse_settings({"models": [{"name": "a", "deployments": [DEP | {"api_base": base}]}]}, env={})


@pytest.mark.parametrize("base", ["htps://bob:${BASE_PASSWORD}@api.example.com/v1", "https://bob:${BASE_PASSWORD}@/v1",
                                  "bob:${BASE_PASSWORD}@api.example.com/v1"])
def test_an_api_base_refused_with_credentials_in_it_is_shown_without_its_password(tmp_path: Path, base: str) -> None:
    """The one line ``serve`` prints (as the reload endpoint's answer and the SIGHUP log line do) names
    the URL, its password masked."""
    path = tmp_path / "c.yaml"
    path.write_text(f"models:\n  - name: a\n    deployments: [{{provider: openai, model: m, api_base: '{base}'}}]\n")
    done = CliRunner(env={"BASE_PASSWORD": "pw-in-the-base-url-0451"}).invoke(app, ["serve", "--config", str(path)])
    assert done.exit_code == 2, done.output
    assert "api_base must be an http(s) URL" in done.stderr and "bob:***@" in done.stderr, done.stderr
    assert "pw-in-the-base-url-0451" not in done.output + done.stderr


def test_a_mistake_in_the_file_names_the_file(tmp_path: Path) -> None:
    """An operator with several config files (and env overrides) is told which one to open."""
    path = tmp_path / "c.yaml"
    assert _load(tmp_path, "server: {port: many}\n") == (
        f"config error at server.port (in {path}): Expected `int`, got `str`")
    assert _load(tmp_path, "auth: {admin_key: '${UNSET_IN_TEST}'}\n") == (
        f"config error at auth.admin_key (in {path}): environment variable UNSET_IN_TEST is not set")
    models = "models: [{name: a, fallbacks: [b], deployments: [{provider: openai, model: m}]}]\n"
    assert f"config error at models[0].fallbacks[0] (in {path}): unknown model 'b'" == _load(tmp_path, models)


@pytest.mark.parametrize(("var", "value", "where"), [
    ("SWITCHYARD__SERVER__PORT", "many", "server.port"),  # a bad value
    ("SWITCHYARD__SERVER__PROT", "9000", "server"),  # a typo'd key
    ("SWITCHYARD__NOPE__KEY", "1", "<root>"),  # a typo'd section
    ("SWITCHYARD__MODELS__0__NAME", "b", "models"),  # list items cannot be overridden
])
def test_a_bad_env_override_names_the_variable_not_the_file(tmp_path: Path, var: str, value: str, where: str) -> None:
    models = "models: [{name: a, deployments: [{provider: openai, model: m}]}]\n"
    message = _load(tmp_path, "server: {port: 8000}\n" + models, env={var: value})
    assert message.startswith(f"config error at {where} (set by environment variable {var}): "), message
    assert str(tmp_path) not in message


def test_an_env_override_that_reads_as_a_number_or_a_date_stays_text_where_the_key_is_text() -> None:
    settings = parse_settings({}, env={
        "SWITCHYARD__AUTH__ADMIN_KEY": "0123456789", "SWITCHYARD__DASHBOARD__SESSION_SECRET": "2024-01-01",
        "SWITCHYARD__SERVER__PORT": "9000", "SWITCHYARD__AUTH__KEY_CACHE_SECONDS": "1.5",
        "SWITCHYARD__QUOTAS__DEFAULT_MAX_TOKENS": "null", "SWITCHYARD__TELEMETRY__METRICS": "false"})
    assert settings.auth.admin_key == "0123456789" and settings.dashboard.session_secret == "2024-01-01"
    assert settings.server.port == 9000 and settings.auth.key_cache_seconds == 1.5
    assert settings.quotas.default_max_tokens is None and settings.telemetry.metrics is False


def test_a_mistake_in_a_price_names_the_model_it_prices() -> None:
    """Prices are keyed by model: the error says whose price is wrong, not ``prices[...]``."""
    with pytest.raises(ConfigError, match=r"^config error at prices\.gpt-4o\.input_per_million: Expected `float` >= 0"):
        parse_settings({"prices": {"a": {}, "gpt-4o": {"input_per_million": -1}}}, env={})
    with pytest.raises(ConfigError, match=r"^config error at prices\.a\.service_tiers\.flex: Object contains unknown"):
        parse_settings({"prices": {"a": {"service_tiers": {"flex": {"input_per_milion": 1}}}}}, env={})


@pytest.mark.parametrize(("dep", "named"), [
    ({"provider": "openai", "options": {"forward_tenat": True}}, "unknown options ['forward_tenat']"),
    ({"provider": "openai", "options": {"forward_tenant": "no"}}, "options.forward_tenant must be true or false"),
    ({"provider": "anthropic", "options": {"max_tokens": "abc"}}, "options.max_tokens must be a positive integer"),
    ({"provider": "anthropic", "options": {"max_tokens": 0}}, "options.max_tokens must be a positive integer"),
])
def test_an_http_deployments_options_are_checked_not_ignored(dep: dict[str, object], named: str) -> None:
    """An HTTP provider's few options are checked at load: a typo is not silently ignored, nor "no" read as true."""
    with pytest.raises(ConfigError, match=r"^config error at models\[0\]\.deployments\[0\]: " + re.escape(named)):
        parse_settings({"models": [{"name": "a", "deployments": [DEP | dep]}]}, env={})
    parse_settings({"models": [{"name": "a", "deployments": [
        DEP | {"options": {"forward_tenant": True}}, DEP | {"provider": "anthropic", "options": {"max_tokens": 8}}]}]},
        env={})


@pytest.mark.parametrize(("dep", "named"), [
    ({"provider": "local", "model": "/m", "api_key": "sk-x"}, "'local' runs the model in this process: api_key "),
    ({"provider": "transformers", "model": "/m", "api_base": "http://h/v1", "drop_params": ["user"]},
     "'transformers' runs the model in this process: api_base, drop_params "),
    ({"provider": "local", "model": "/m", "responses_api": True}, "in this process: responses_api "),
    ({"provider": "anthropic", "model": "c", "responses_api": True}, "responses_api applies to openai deployments"),
])
def test_a_field_the_provider_never_reads_is_an_error_not_ignored(dep: dict[str, object], named: str) -> None:
    """An engine run in this process has no upstream to send a key or drop a field for."""
    with pytest.raises(ConfigError, match=r"^config error at models\[0\]\.deployments\[0\]: .*" + re.escape(named)):
        parse_settings({"models": [{"name": "a", "deployments": [dep]}]}, env={})


def test_a_model_that_falls_back_to_itself_is_an_error() -> None:
    """The router never tries a group twice, so such a fallback would be silently ignored."""
    for name in ("a", "a-latest"):
        with pytest.raises(ConfigError, match=r"^config error at models\[0\]\.fallbacks\[0\]: model 'a' falls back "):
            parse_settings({"models": [{"name": "a", "aliases": ["a-latest"], "fallbacks": [name],
                                        "deployments": [DEP]}]}, env={})


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300])
def test_an_endless_dashboard_session_is_an_error_not_a_failing_sign_in(value: float) -> None:
    """``session_seconds: .inf`` was accepted, and then every dashboard sign-in failed making its cookie."""
    with pytest.raises(ConfigError, match=r"^config error at dashboard\.session_seconds: Expected `float` (<=|>) "):
        parse_settings({"dashboard": {"session_seconds": value}}, env={})
    parse_settings({"dashboard": {"session_seconds": 100 * 365 * 86400}}, env={})


def test_an_empty_host_is_an_error_not_every_interface() -> None:
    """``host: ${HOST}`` with HOST set empty would bind "" (every interface), opening the gateway to the network."""
    with pytest.raises(ConfigError, match=r"^config error at server\.host: Expected `str` of length >= 1"):
        parse_settings({"server": {"host": ""}}, env={})
    assert parse_settings({"server": {"host": "0.0.0.0"}}, env={}).server.host == "0.0.0.0"


def test_an_otlp_endpoint_that_is_no_url_is_an_error_not_traces_lost() -> None:
    with pytest.raises(ConfigError, match=r"^config error at telemetry\.otlp_endpoint: Expected `str` matching regex"):
        parse_settings({"telemetry": {"tracing": True, "otlp_endpoint": "collector:4318"}}, env={})
    url = "http://collector:4318/v1/traces"
    assert parse_settings({"telemetry": {"otlp_endpoint": url}}, env={}).telemetry.otlp_endpoint == url


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300])
@pytest.mark.parametrize(("where", "key"), [
    ("timeouts", "connect"), ("timeouts", "first_byte"), ("timeouts", "total"), ("timeouts", "idle"),
    ("circuit", "window"), ("circuit", "cooldown"),
])
def test_an_endless_timeout_or_circuit_period_is_an_error(where: str, key: str, value: float) -> None:
    """``total: .inf`` or ``cooldown: .inf`` was accepted: a timeout that never fires, a circuit never retried."""
    if where == "timeouts":
        group: dict[str, object] = {"name": "a", "deployments": [{**DEP, "timeouts": {key: value}}]}
        at = rf"models\[0\]\.deployments\[0\]\.timeouts\.{key}"
    else:
        group = {"name": "a", "deployments": [DEP], "circuit": {key: value}}
        at = rf"models\[0\]\.circuit\.{key}"
    with pytest.raises(ConfigError, match=rf"^config error at {at}: Expected `float` (<=|>) "):
        parse_settings({"models": [group]}, env={})


def test_a_day_long_timeout_or_circuit_period_is_accepted() -> None:
    group = {"name": "a", "deployments": [{**DEP, "timeouts": {"total": 86400, "idle": 86400}}],
             "circuit": {"window": 86400, "cooldown": 86400}}
    model = parse_settings({"models": [group]}, env={}).models[0]
    assert model.circuit.cooldown == 86400 and model.deployments[0].timeouts.total == 86400


def test_an_endless_timeout_in_a_config_file_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - name: a\n    deployments:\n      - {provider: openai, model: m, "
                    "api_base: 'http://127.0.0.1:9/v1', timeouts: {idle: .inf}}\n")
    done = CliRunner().invoke(app, ["tenant", "list", "--config", str(path)])
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: config error at models[0].deployments[0].timeouts.idle "), lines[0]
    assert lines[0].endswith(": Expected `float` <= 86400.0"), lines[0]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300])
@pytest.mark.parametrize("price", [{"output_per_million": None}, {"per_tool_call": {"web_search": None}},
                                   {"service_tiers": {"flex": {"input_per_million": None}}}])
def test_an_endless_price_is_an_error_not_an_endless_cost(price: dict[str, object], value: float) -> None:
    """A price of ``.inf`` made every request's cost infinite: a budget spent by one request, a usage
    row's cost stored as infinity (and null in JSON)."""
    def filled(d: dict[str, object]) -> dict[str, object]:
        return {k: filled(v) if isinstance(v, dict) else value for k, v in d.items()}
    with pytest.raises(ConfigError, match=r"^config error at prices\.a\.\S+: Expected `float` (<=|>=) "):
        parse_settings({"models": [{"name": "a", "deployments": [DEP]}], "prices": {"a": filled(price)}}, env={})
    parse_settings({"models": [{"name": "a", "deployments": [DEP]}], "prices": {"a": {"output_per_million": 1e12}}},
                   env={})


def test_one_deployment_name_for_two_different_deployments_is_an_error() -> None:
    """A price keyed by a deployment's name (and its metrics) would apply to both, whatever each calls."""
    with pytest.raises(ConfigError, match=re.escape(
            "config error at models[1].deployments[0]: deployment 'primary' is defined twice with different "
            "upstreams (models[0].deployments[0] and here): give each its own name")):
        parse_settings({"models": [{"name": "a", "deployments": [DEP | {"name": "primary"}]},
                                   {"name": "b", "deployments": [DEP | {"name": "primary", "model": "m2"}]}]}, env={})
    # one upstream in two models may be weighted and limited apart in each
    parse_settings({"models": [{"name": "a", "deployments": [DEP | {"name": "primary"}]},
                               {"name": "b", "deployments": [DEP | {"name": "primary", "weight": 3}]}]}, env={})


def test_serve_refuses_a_database_url_it_cannot_use_as_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("database:\n  url: mysql://u@h/db\n")
    done = CliRunner().invoke(app, ["serve", "--config", str(path)])
    assert done.exit_code == 2, done.output
    assert done.stderr == (f"error: config error at database (in {path}): database.url must name SQLite or "
                           "PostgreSQL, got 'mysql' (e.g. sqlite+aiosqlite://, postgresql+asyncpg://)\n"), done.stderr
