"""The engine's prefix-cache hits are on the meter from the engine's first output on, so a streamed
chat completion the client cancels after its first tokens is charged its cached prompt tokens as
such (``cached_tokens`` on the usage row, priced at the model's cached rate), through the gateway
with the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.local_gateway import Env, local_gateway

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0, "cached_input_per_million": 0.3}
PREFIX = "A long shared prefix about railways and their many stations, bridges and tunnels. " * 8


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("cached"), enable_prefix_caching=True,
                       prices={"tiny": PRICE}) as served:
        yield served


def _messages(question: str) -> Any:
    return [{"role": "system", "content": PREFIX}, {"role": "user", "content": question}]


def test_a_stream_cancelled_mid_way_is_charged_its_cached_prompt_at_the_cached_price(env: Env) -> None:
    client = env.client()
    client.chat.completions.create(model="tiny", messages=_messages("Tell me about trains."), max_tokens=2)
    env.usage.records.clear()
    stream = client.chat.completions.create(model="tiny", messages=_messages("And about boats?"), max_tokens=1000,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()
    record = env.usage.wait_for(1)[-1]
    assert record.extra.get("outcome") == "client_disconnected"
    assert record.exact and 0 < record.completion_tokens < 1000
    assert 0 < record.cached_tokens < record.prompt_tokens and record.cached_tokens % 16 == 0
    plain = record.prompt_tokens - record.cached_tokens
    expected = (plain * 3.0 + record.cached_tokens * 0.3 + record.completion_tokens * 15.0) / 1_000_000
    assert record.cost == pytest.approx(expected)
    env.wait_idle()
