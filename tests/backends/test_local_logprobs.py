"""Text completions' ``logprobs.top_logprobs`` on the local engine: as OpenAI and vLLM answer, each
position's dict holds the ``logprobs`` most likely tokens and always the token actually there (the
sampled one, or the echoed prompt's), so it has ``logprobs`` or ``logprobs + 1`` entries; the same
streamed as not."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from backends.local import LocalEngineBackend
from backends.openai_wire import CompletionLogprobs, CompletionRequest
from engine import AsyncEngine, EngineConfig
from engine.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LocalEngineBackend:
    folder = build_tiny_model(tmp_path_factory.mktemp("logprobs") / "tiny", seed=5, max_position_embeddings=512)
    engine = AsyncEngine(EngineConfig(model=str(folder), num_kv_blocks=64, block_size=16, max_model_len=128))
    return LocalEngineBackend(engine, str(folder))


def completion(**body: Any) -> CompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "tiny", "prompt": "The train runs", **body}),
                               type=CompletionRequest)


def _assert_the_token_is_among_its_top(lp: CompletionLogprobs, k: int) -> int:
    """Every scored position lists its own token with its logprob; return how many were not in the
    top ``k`` (so the test knows it saw some)."""
    outside = 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        if value is None:
            assert top is None  # the prompt's first token: nothing predicts it
            continue
        assert top is not None and top.get(token) == pytest.approx(value), (token, value, top)
        assert k <= len(top) <= k + 1
        outside += len(top) == k + 1
    return outside


@pytest.mark.parametrize("k", [0, 1, 2])
async def test_top_logprobs_always_hold_the_sampled_and_echoed_tokens(backend: LocalEngineBackend, k: int) -> None:
    body = dict(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True, logprobs=k, echo=True)
    choice = (await backend.complete(completion(**body))).response.choices[0]
    assert choice.logprobs is not None
    assert _assert_the_token_is_among_its_top(choice.logprobs, k) > 0  # sampling at t=1 left the top k
    streamed = await backend.complete_stream(completion(**body, stream=True))
    parts = [ch.logprobs for c in [c async for c in streamed.chunks] for ch in c.choices if ch.logprobs]
    assert [t for p in parts for t in p.top_logprobs] == choice.logprobs.top_logprobs
