"""A request that is heavy to prepare (a grammar that takes seconds to compile) is prepared off the
event loop: another request is served meanwhile, not after it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.local_gateway import KEY, Env, local_gateway

HEADERS = {"Authorization": f"Bearer {KEY}"}
# Tens of thousands of alternatives: seconds of grammar compilation (then a 400: too many symbols).
BIG_GRAMMAR = "start: " + " | ".join(f'"w{i}"' for i in range(60000))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("heavy")) as served:
        yield served


def _chat(env: Env, **fields: Any) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **fields}
    return httpx.post(env.server.url + "/v1/chat/completions", headers=HEADERS, json=body, timeout=120)


@pytest.mark.parametrize("field", ["guided_grammar", "structured_outputs"])
def test_a_grammar_compiles_while_others_are_served(env: Env, field: str) -> None:
    grammar: Any = BIG_GRAMMAR + f" | \"{field}\""  # not the other case's: no cache hit
    value = grammar if field == "guided_grammar" else {"grammar": grammar}
    heavy: dict[str, Any] = {}

    def attack() -> None:
        started = time.monotonic()
        heavy["response"] = _chat(env, **{field: value})
        heavy["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=attack)
    thread.start()
    time.sleep(0.5)  # the heavy request is compiling
    started = time.monotonic()
    assert _chat(env).status_code == 200
    served_in = time.monotonic() - started
    thread.join()
    assert heavy["response"].status_code == 400  # and its error names the field
    assert heavy["response"].json()["error"]["param"].startswith(field)
    assert heavy["seconds"] > 2  # heavy indeed (else this test proves nothing)
    assert served_in < heavy["seconds"] / 2
