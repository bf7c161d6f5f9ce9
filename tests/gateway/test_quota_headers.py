"""Quotas as a client sees them: the real app on PostgreSQL and Redis, the openai SDK against the
fake upstream; the x-ratelimit-* headers, 429 bodies, concurrency released however a request ends,
budgets spent by streams, and limit changes through the admin API."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, migrated_pg_url  # noqa: F401
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread

CHAT = [{"role": "user", "content": "hello there general kenobi"}]
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")  # OpenAI's reset: "1s", "6m0s", "20ms"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str) -> float:
    return sum(float(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration))


@dataclass
class Gateway:
    url: str
    admin: httpx.Client

    def tenant_key(self, tenant: dict[str, Any] | None = None, key: dict[str, Any] | None = None) -> tuple[str, dict]:
        tid = self.admin.post("/admin/v1/tenants", json={"name": f"h-{uuid.uuid4().hex[:8]}"}).json()["id"]
        if tenant:
            assert self.admin.put(f"/admin/v1/tenants/{tid}/limits", json=tenant).status_code == 200
        created = self.admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
        if key:
            assert self.admin.put(f"/admin/v1/keys/{created['id']}/limits", json=key).status_code == 200
        return tid, created

    def client(self, key: dict[str, Any]) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key["key"], max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def gateway(migrated_pg_url: str, fake_upstream_server: FakeUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    from gateway.app import create_app

    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url,
                  "api_key": "sk-up"}
    settings = gateway_settings(
        fake_upstream_server.url, database={"url": migrated_pg_url}, redis={"url": REDIS_URL},
        usage={"journal_dir": str(tmp_path_factory.mktemp("journal"))},
        models=[{"name": "echo", "deployments": [deployment], "max_retries": 0}],
        prices={"echo": {"input_per_million": 10.0, "output_per_million": 10.0}},
    )  # fmt: skip
    with ServerThread(create_app(settings)) as server, httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20
    ) as admin:
        yield Gateway(server.url, admin)


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.with_raw_response.create(model="echo", **({"messages": CHAT} | kwargs))


def test_headers_on_a_200_count_down_within_the_limits(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 5, "tokens_per_minute": 10_000})
    client = gateway.client(key)
    seen = []
    for _ in range(3):
        h = chat(client, max_tokens=5).headers
        assert h["x-ratelimit-limit-requests"] == "5" and h["x-ratelimit-limit-tokens"] == "10000"
        assert DURATION.match(h["x-ratelimit-reset-requests"]) and DURATION.match(h["x-ratelimit-reset-tokens"])
        seen.append(int(h["x-ratelimit-remaining-requests"]))
    assert seen == [4, 3, 2]


def test_headers_on_a_stream(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 5, "tokens_per_minute": 10_000})
    with gateway.client(key).chat.completions.with_streaming_response.create(
            model="echo", messages=CHAT, stream=True, max_tokens=5) as response:  # type: ignore[arg-type]
        h = response.headers
        assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("5", "4")
        assert h["x-ratelimit-limit-tokens"] == "10000" and int(h["x-ratelimit-remaining-tokens"]) < 10_000
        list(response.iter_lines())


def test_a_429_is_openais_error_with_retry_after_and_headers(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 1, "tokens_per_minute": 10_000})
    client = gateway.client(key)
    chat(client, max_tokens=5)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(client, max_tokens=5)
    r = refused.value.response
    assert refused.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert refused.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert (r.headers["x-ratelimit-limit-requests"], r.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    assert DURATION.match(r.headers["x-ratelimit-reset-requests"])
    assert r.headers["x-ratelimit-limit-tokens"] == "10000"


def test_key_and_tenant_limits_both_apply_and_the_headers_show_the_tighter(
        gateway: Gateway, upstream: FakeUpstream) -> None:
    tid, key = gateway.tenant_key({"requests_per_minute": 3}, {"requests_per_minute": 2})
    h = chat(gateway.client(key), max_tokens=5).headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "1")
    chat(gateway.client(key), max_tokens=5)
    with pytest.raises(openai.RateLimitError, match="key"):
        chat(gateway.client(key), max_tokens=5)
    other = gateway.admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
    chat(gateway.client(other), max_tokens=5)  # the tenant's third
    with pytest.raises(openai.RateLimitError, match="tenant"):
        chat(gateway.client(other), max_tokens=5)


def concurrency_free(gateway: Gateway, key: dict[str, Any], within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chat(gateway.client(key), max_tokens=2)
            return True
        except openai.RateLimitError:
            time.sleep(0.1)
    return False


def test_concurrency_is_released_however_a_request_ends(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"max_concurrency": 1})
    client = gateway.client(key)
    for _ in client.chat.completions.create(model="echo", messages=CHAT, stream=True):  # type: ignore[arg-type]
        pass
    assert concurrency_free(gateway, key)
    upstream.fail_next(Fault(hang_after_chunks=2))
    with client.chat.completions.with_streaming_response.create(
            model="echo", messages=CHAT, stream=True) as response:  # type: ignore[arg-type]
        lines = response.iter_lines()  # kept: a generator dropped closes the response
        next(lines)
        with pytest.raises(openai.RateLimitError):
            chat(client, max_tokens=2)  # the stream holds the only slot
    assert concurrency_free(gateway, key)  # the client left mid-stream
    upstream.fail_next(Fault(status=500))
    with pytest.raises(openai.APIStatusError):
        chat(client, max_tokens=2)
    assert concurrency_free(gateway, key)
    upstream.fail_next(Fault(error_after_chunks=2))
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="echo", messages=CHAT, stream=True):  # type: ignore[arg-type]
            pass
    assert concurrency_free(gateway, key)


@pytest.mark.parametrize(("limits", "what", "least"), [
    ({"token_budget": 2000, "budget_period": "day"}, "token budget", 5),
    ({"cost_budget": 0.01, "budget_period": "month"}, "spending budget", 3),  # 1000 tokens at 10 USD/M
])
def test_a_budget_is_spent_by_streams(gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any], what: str,
                                      least: int) -> None:
    _, key = gateway.tenant_key(limits)
    client = gateway.client(key)
    upstream.options.output_words = 100
    admitted = 0
    for _ in range(40):
        try:
            for _ in client.chat.completions.create(model="echo", messages=CHAT, stream=True,  # type: ignore[arg-type]
                                                    max_tokens=200):
                pass
            admitted += 1
        except openai.RateLimitError as exc:
            assert what in exc.message
            break
    assert least <= admitted < 40


def test_a_limit_changed_through_the_admin_api_takes_effect(gateway: Gateway, upstream: FakeUpstream) -> None:
    tid, key = gateway.tenant_key({"requests_per_minute": 1})
    client = gateway.client(key)
    chat(client, max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        chat(client, max_tokens=2)
    assert gateway.admin.patch(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 10}).status_code == 200
    deadline = time.monotonic() + 5
    while True:
        try:
            h = chat(client, max_tokens=2).headers
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert h["x-ratelimit-limit-requests"] == "10"
    assert gateway.admin.patch(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": None}).status_code == 200
    time.sleep(2.5)
    assert "x-ratelimit-limit-requests" not in chat(client, max_tokens=2).headers


@pytest.mark.parametrize("body", [
    {"requests_per_minute": -5}, {"requests_per_minute": "ten"}, {"requests_per_minute": 1.5},
    {"tokens_per_minute": 2**40}, {"cost_budget": -1}, {"cost_budget": 1e308}, {"budget_period": "week"},
    {"max_concurrency": True}, {"token_budget": 2**70},
])
def test_bad_limit_values_are_a_400(gateway: Gateway, body: dict[str, Any]) -> None:
    tid, _ = gateway.tenant_key()
    for method in ("put", "patch"):
        r = getattr(gateway.admin, method)(f"/admin/v1/tenants/{tid}/limits", json=body)
        assert r.status_code == 400, (method, body, r.text)
        assert r.json()["error"]["param"] == next(iter(body))


def test_remaining_tokens_count_what_was_used_once_settled(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"tokens_per_minute": 10_000})
    client = gateway.client(key)
    first = chat(client, max_tokens=500)
    reserved = 10_000 - int(first.headers["x-ratelimit-remaining-tokens"])
    used = first.parse().usage.total_tokens
    assert used < reserved
    second = chat(client, max_tokens=500)
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 10_000 - used - reserved


def test_a_refused_stream_is_a_json_429(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 1})
    client = gateway.client(key)
    chat(client, max_tokens=2)
    r = httpx.post(gateway.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key['key']}"},
                   json={"model": "echo", "messages": CHAT, "stream": True})
    assert r.status_code == 429 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-remaining-requests"] == "0"


def test_a_tokens_refusal_says_what_is_left(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"tokens_per_minute": 1000})
    client = gateway.client(key)
    upstream.options.output_words = 300
    used = chat(client, max_tokens=400).parse().usage.total_tokens
    with pytest.raises(openai.RateLimitError, match="tokens per minute") as refused:
        chat(client, max_tokens=700)
    h = refused.value.response.headers
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("1000", str(1000 - used))
    assert 1 <= int(h["retry-after"]) <= 60 and DURATION.match(h["x-ratelimit-reset-tokens"])


def test_streams_without_usage_from_the_upstream_still_spend_the_budget(
        gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"token_budget": 1500, "budget_period": "total"})
    client = gateway.client(key)
    upstream.options.report_usage = False
    upstream.options.output_words = 100
    admitted = 0
    for _ in range(30):
        try:
            for _ in client.chat.completions.create(model="echo", messages=CHAT, stream=True,  # type: ignore[arg-type]
                                                    max_tokens=200):
                pass
            admitted += 1
        except openai.RateLimitError:
            break
    assert 1 <= admitted < 30


def test_a_stream_the_client_cuts_off_spends_what_it_got(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"token_budget": 1000, "budget_period": "total"})
    client = gateway.client(key)
    upstream.options.output_words = 1000
    upstream.options.chunk_delay = 0.01
    for _ in range(5):  # each reserves ~300 (prompt bound + 200) and is cut off after a few chunks
        with client.chat.completions.with_streaming_response.create(
                model="echo", messages=CHAT, stream=True, max_tokens=200) as response:  # type: ignore[arg-type]
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
        time.sleep(0.3)


def test_other_endpoints_carry_the_headers_and_are_limited(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 3, "tokens_per_minute": 10_000})
    client = gateway.client(key)
    done = client.completions.with_raw_response.create(model="echo", prompt="hello", max_tokens=3)
    assert done.headers["x-ratelimit-remaining-requests"] == "2"
    emb = client.embeddings.with_raw_response.create(model="echo", input="hello")
    assert emb.headers["x-ratelimit-remaining-requests"] == "1"
    resp = client.responses.with_raw_response.create(model="echo", input="hello", max_output_tokens=16)
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as refused:
        client.embeddings.create(model="echo", input="hello")
    assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_concurrency_is_released_when_the_client_gives_up_before_the_answer(
        gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"max_concurrency": 1})
    upstream.options.latency = 1.5
    impatient = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["key"], max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        chat(impatient, max_tokens=2)
    upstream.options.latency = 0.0
    assert concurrency_free(gateway, key, within=1.0)


def test_messages_api_refusal_in_anthropics_shape(gateway: Gateway, upstream: FakeUpstream) -> None:
    import anthropic

    _, key = gateway.tenant_key({"requests_per_minute": 1})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key["key"], max_retries=0, timeout=20)
    ok = client.messages.with_raw_response.create(model="echo", max_tokens=10,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert ok.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="echo", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_limits_of_unknown_scopes_are_404(gateway: Gateway) -> None:
    for scope in ("tenants", "keys"):
        for method, body in (("get", None), ("put", {"requests_per_minute": 1}), ("patch", {"max_concurrency": 2})):
            kwargs = {} if body is None else {"json": body}
            r = getattr(gateway.admin, method)(f"/admin/v1/{scope}/nope/limits", **kwargs)
            assert r.status_code == 404, (scope, method, r.text)


@pytest.mark.parametrize(("limits", "what"), [
    ({"tokens_per_minute": 300}, "tokens per minute"),
    ({"token_budget": 300, "budget_period": "day"}, "token budget"),
    ({"cost_budget": 0.003, "budget_period": "month"}, "spending budget"),  # 300 tokens at 10 USD/M
])
def test_a_request_larger_than_a_whole_limit_is_told_to_shrink_not_to_retry(
        gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any], what: str) -> None:
    """No wait ever admits a request that reserves more than the limit itself: the 429 says so,
    with no Retry-After, and tells the SDKs not to retry."""
    _, key = gateway.tenant_key(limits)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(gateway.client(key), max_tokens=400)
    assert what in refused.value.message and "max_tokens" in refused.value.message
    assert "retry after" not in refused.value.message and "exhausted" not in refused.value.message
    assert refused.value.code == "rate_limit_exceeded"
    h = refused.value.response.headers
    assert "retry-after" not in h and h["x-should-retry"] == "false"
    chat(gateway.client(key), max_tokens=20)  # a smaller one fits


@pytest.mark.parametrize(("limits", "what"), [
    ({"token_budget": 1000, "budget_period": "day"}, "token budget"),
    ({"cost_budget": 0.01, "budget_period": "month"}, "spending budget"),  # 1000 tokens at 10 USD/M
])
def test_a_budget_with_room_left_is_not_called_exhausted(
        gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any], what: str) -> None:
    """A request reserving more than a budget has left is refused until the period ends (or
    requests in flight settle below their reservations), but the budget is not said to be spent:
    the message names the reservation, so the client can ask for fewer tokens."""
    _, key = gateway.tenant_key(limits)
    upstream.options.output_words = 400
    assert chat(gateway.client(key), max_tokens=400).parse().usage.total_tokens > 400
    with pytest.raises(openai.RateLimitError) as refused:
        chat(gateway.client(key), max_tokens=700)  # fits the budget, not what is left of it
    assert what in refused.value.message and "exhausted" not in refused.value.message
    assert "max_tokens" in refused.value.message
    assert int(refused.value.response.headers["retry-after"]) >= 1
    chat(gateway.client(key), max_tokens=20)


@pytest.mark.parametrize(("limits", "what"), [
    ({"token_budget": 1000, "budget_period": "total"}, "token budget"),
    ({"cost_budget": 0.01, "budget_period": "total"}, "spending budget"),  # 1000 tokens at 10 USD/M
])
def test_a_spent_lifetime_budget_is_not_told_to_retry(
        gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any], what: str) -> None:
    """A budget that never resets, spent: no wait restores it, so the 429 has no Retry-After, tells
    the SDKs not to retry, and says an admin must raise it."""
    _, key = gateway.tenant_key(limits)
    upstream.options.output_words = 400
    assert chat(gateway.client(key), max_tokens=400).parse().usage.total_tokens > 400
    with pytest.raises(openai.RateLimitError) as refused:
        chat(gateway.client(key), max_tokens=700)
    assert what in refused.value.message and "spent" in refused.value.message
    assert "admin must raise" in refused.value.message and "retry after" not in refused.value.message
    h = refused.value.response.headers
    assert "retry-after" not in h and "retry-after-ms" not in h and h["x-should-retry"] == "false"


def test_a_refusal_names_the_field_the_reservation_came_from(gateway: Gateway, upstream: FakeUpstream) -> None:
    """Each endpoint's 429 names the request's own field that capped the output it reserved."""
    import anthropic

    _, key = gateway.tenant_key({"tokens_per_minute": 300})
    client = gateway.client(key)
    calls = {
        "max_completion_tokens": lambda: chat(client, max_completion_tokens=400),
        "max_tokens": lambda: chat(client, max_tokens=400),
        "completions max_tokens": lambda: client.completions.create(model="echo", prompt="hi", max_tokens=400),
        "max_output_tokens": lambda: client.responses.create(model="echo", input="hi", max_output_tokens=400),
    }
    for field, call in calls.items():
        with pytest.raises(openai.RateLimitError) as refused:
            call()
        named = field.split()[-1]
        assert f"plus {named} for each choice" in refused.value.message, (field, refused.value.message)
        assert f"or {named}." in refused.value.message, (field, refused.value.message)
    with pytest.raises(openai.RateLimitError) as refused:
        client.embeddings.create(model="echo", input="hello " * 400)
    assert "(its input)" in refused.value.message and "reduce the input" in refused.value.message
    assert "max_" not in refused.value.message
    messages = anthropic.Anthropic(base_url=gateway.url, api_key=key["key"], max_retries=0, timeout=20)
    with pytest.raises(anthropic.RateLimitError) as too_big:
        messages.messages.create(model="echo", max_tokens=400, messages=[{"role": "user", "content": "hi"}])
    assert "plus max_tokens for each choice" in too_big.value.message, too_big.value.message


def test_reset_headers_lie_within_the_window(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 5, "tokens_per_minute": 10_000})
    h = chat(gateway.client(key), max_tokens=5).headers
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        assert DURATION.match(h[name]) and 0 < seconds(h[name]) <= 60


def test_every_choice_is_reserved(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"tokens_per_minute": 10_000})
    one = 10_000 - int(chat(gateway.client(key), max_tokens=100).headers["x-ratelimit-remaining-tokens"])
    _, key = gateway.tenant_key({"tokens_per_minute": 10_000})
    three = 10_000 - int(chat(gateway.client(key), max_tokens=100, n=3).headers["x-ratelimit-remaining-tokens"])
    assert three == one + 200


def test_a_budget_moved_to_another_period_keeps_what_was_spent(gateway: Gateway, upstream: FakeUpstream) -> None:
    tid, key = gateway.tenant_key({"token_budget": 1000, "budget_period": "day"})
    upstream.options.output_words = 400
    chat(gateway.client(key), max_tokens=400)
    assert gateway.admin.patch(f"/admin/v1/tenants/{tid}/limits", json={"budget_period": "total"}).status_code == 200
    time.sleep(2.5)  # the limits cache
    with pytest.raises(openai.RateLimitError, match="token budget"):
        chat(gateway.client(key), max_tokens=700)


@pytest.mark.parametrize("limits", [{"requests_per_minute": 0}, {"max_concurrency": 0}, {"tokens_per_minute": 0},
                                    {"token_budget": 0}, {"cost_budget": 0}])
def test_a_limit_of_zero_is_not_told_to_retry(gateway: Gateway, upstream: FakeUpstream,
                                              limits: dict[str, Any]) -> None:
    _, key = gateway.tenant_key(limits)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(gateway.client(key), max_tokens=5)
    assert "is 0" in refused.value.message and "retry after" not in refused.value.message
    h = refused.value.response.headers
    assert "retry-after" not in h and h["x-should-retry"] == "false"


def test_the_messages_api_is_not_told_to_retry_a_request_too_large(gateway: Gateway, upstream: FakeUpstream) -> None:
    import anthropic

    _, key = gateway.tenant_key({"tokens_per_minute": 100})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key["key"], max_retries=2, timeout=20)
    with pytest.raises(anthropic.RateLimitError, match="too large") as refused:
        client.messages.create(model="echo", max_tokens=500, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in refused.value.response.headers


async def test_headers_of_a_burst_stay_within_the_limits(gateway: Gateway, upstream: FakeUpstream) -> None:
    """A busy key is admitted on credit (credit.py): its headers still name the configured limit,
    and the last wave's count the 80 requests admitted before it."""
    import asyncio

    _, key = gateway.tenant_key({"requests_per_minute": 1000, "tokens_per_minute": 1_000_000})
    async with httpx.AsyncClient(timeout=20) as http:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key["key"], max_retries=0, http_client=http)
        for _ in range(3):
            answers = await asyncio.gather(*[client.chat.completions.with_raw_response.create(
                model="echo", messages=CHAT, max_tokens=2) for _ in range(40)])  # type: ignore[arg-type]
            await asyncio.sleep(0.3)
    remaining = [int(a.headers["x-ratelimit-remaining-requests"]) for a in answers]
    assert {a.headers["x-ratelimit-limit-requests"] for a in answers} == {"1000"}
    assert all(0 <= r < 1000 - 80 for r in remaining), remaining


def test_a_limit_set_with_the_cli_takes_effect(gateway: Gateway, migrated_pg_url: str, upstream: FakeUpstream,
                                               tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    tid, key = gateway.tenant_key({"requests_per_minute": 100})
    config = tmp_path / "switchyard.yaml"
    config.write_text(f"database:\n  url: {migrated_pg_url}\n")
    done = CliRunner().invoke(app, ["limits", "set", "--tenant", tid, "--rpm", "7"],
                              env={"SWITCHYARD_CONFIG": str(config)})
    assert done.exit_code == 0, done.output
    time.sleep(2.5)  # the limits cache
    assert chat(gateway.client(key), max_tokens=2).headers["x-ratelimit-limit-requests"] == "7"
    bad = CliRunner().invoke(app, ["limits", "set", "--tenant", tid, "--rpm", "-7"],
                             env={"SWITCHYARD_CONFIG": str(config)})
    assert bad.exit_code == 1 and "--rpm" in bad.stderr and "Traceback" not in bad.output
