"""The local engine served through the gateway, with the official openai SDK as the client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from backends.factory import build_backend
from engine import SamplingParams
from engine.tokenizer import Tokenizer
from gateway.settings import ConfigError, DeploymentConfig
from tests.support.local_gateway import Env, local_gateway

MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Tell me about trains."}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("local")) as served:
        yield served


def hf_greedy(folder: Path, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=sorted(eos), pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_chat_is_served_by_the_engine_with_exact_usage(env: Env) -> None:
    tok = Tokenizer(env.folder)
    prompt = tok.apply_chat_template(MESSAGES)
    want = hf_greedy(env.folder, prompt, 12, tok.eos_token_ids)
    resp = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert resp.choices[0].message.content == tok.decode(want)
    assert resp.choices[0].finish_reason == ("stop" if want[-1] in tok.eos_token_ids else "length")
    assert resp.usage.prompt_tokens == len(prompt)
    assert resp.usage.completion_tokens == len(want)
    record = env.usage.wait_for(1)[-1]
    assert record.exact and record.prompt_tokens == len(prompt) and record.completion_tokens == len(want)
    env.wait_idle()


def test_stream_matches_non_stream_and_reports_usage(env: Env) -> None:
    client = env.client()
    args = {"model": "tiny", "messages": MESSAGES, "max_tokens": 20, "temperature": 0,
            "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 20)
    env.wait_idle()


def test_seeded_sampling_n_and_completions(env: Env) -> None:
    client = env.client()
    args = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0.9, "seed": 11, "n": 2}
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len(a.choices) == 2 and a.usage.completion_tokens <= 16
    tok = Tokenizer(env.folder)
    prompts = ["The train", "Hello world, how"]
    resp = client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert resp.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert resp.usage.completion_tokens == 10
    env.wait_idle()


def test_logprobs_and_streamed_completions(env: Env) -> None:
    client = env.client()
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    for lp in content:
        assert len(lp.top_logprobs) == 3 and lp.logprob <= 0
        assert lp.top_logprobs[0].logprob >= lp.top_logprobs[-1].logprob
        assert lp.logprob == pytest.approx(lp.top_logprobs[0].logprob)  # greedy: the best token was taken
    whole = client.completions.create(model="tiny", prompt="The train", max_tokens=6, temperature=0, logprobs=2,
                                      echo=True, extra_body={"ignore_eos": True})
    assert whole.choices[0].text.startswith("The train")
    lp = whole.choices[0].logprobs  # echo with logprobs: the prompt's tokens (BOS, The, train) lead
    assert len(lp.tokens) == 3 + 6 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[1:3] == [0, 3] and all(v <= 0 for v in lp.token_logprobs[1:])
    parts = list(client.completions.create(model="tiny", prompt="The train", max_tokens=6, temperature=0,
                                           echo=True, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason] == ["length"]
    env.wait_idle()


def test_client_disconnect_aborts_and_frees_kv(env: Env) -> None:
    env.usage.records.clear()
    stream = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1900, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 3:
            break
    assert env.backend.engine_metrics().kv_usage > 0.0  # the sequence holds blocks while streaming
    stream.close()
    env.wait_idle()  # aborted: nothing running, every block free again
    record = env.usage.wait_for(1)[-1]
    assert record.extra.get("outcome") == "client_disconnected"
    assert 3 <= record.completion_tokens < 1900


def test_prompt_too_long_is_a_clear_400(env: Env) -> None:
    long = " ".join(["train"] * 2100)
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}])
    assert err.value.code == "context_length_exceeded"
    assert "context" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2100)
    assert err.value.code == "context_length_exceeded" and "max_tokens" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, logit_bias={"5": 300})
    assert "logit_bias" in err.value.message and err.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError) as err:  # as many entries as the vocabulary holds, no more
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, logit_bias={"1000000000": 1})
    assert "logit_bias" in err.value.message and err.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError) as err:  # looked up for every token generated
        env.client().chat.completions.create(model="tiny", messages=MESSAGES,
                                             extra_body={"stop_token_ids": [1] * 1025})
    assert "at most 1024" in err.value.message and err.value.param == "stop_token_ids"
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, top_p=0)
    assert "top_p must be in (0, 1]" in err.value.message and err.value.param == "top_p"
    env.wait_idle()


def test_stats_report_queue_and_kv(env: Env) -> None:
    stats = env.backend.stats()
    assert stats.queue_depth == 0 and stats.in_flight == 0 and stats.kv_cache_usage == 0.0


async def test_stats_count_requests_added_during_a_step_as_queued(env: Env) -> None:
    """A request the engine has accepted but not yet scheduled (it joins after the running step) is
    in flight and queued, once per sequence; ``queue_depth`` is part of ``in_flight``."""
    backend = build_backend(DeploymentConfig(provider="local", model=str(env.folder),
                                             options={"num_kv_blocks": 192, "block_size": 16}))
    try:
        outputs = backend.engine.add_request("stats-1", [5, 6, 7], SamplingParams(max_tokens=3, n=2))
        stats = backend.stats()
        assert (stats.in_flight, stats.queue_depth) == (2, 2)
        async for out in outputs:  # noqa: B007 (the last output is checked below)
            pass
        assert out.finished
        stats = backend.stats()
        assert (stats.in_flight, stats.queue_depth) == (0, 0)
    finally:
        await backend.aclose()


def test_bad_deployment_options(env: Env, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown options \\['warp'\\]"):
        build_backend(DeploymentConfig(provider="local", model=str(env.folder), options={"warp": 9}))
    with pytest.raises(ConfigError, match="builtin must be 'tiny'"):
        build_backend(DeploymentConfig(provider="local", model=str(tmp_path / "x"), options={"builtin": "huge"}))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot build the tiny model.*not a complete model folder"):
        build_backend(DeploymentConfig(provider="local", model=str(tmp_path / "junk"), options={"builtin": "tiny"}))
    with pytest.raises(ConfigError, match="does not exist"):
        build_backend(DeploymentConfig(provider="local", model=str(tmp_path / "absent")))
    with pytest.raises(ConfigError, match=r"local:.*: max_num_batched_tokens \(4\) must be >= max_num_seqs \(8\)"):
        build_backend(DeploymentConfig(provider="local", model=str(env.folder),
                                       options={"max_num_seqs": 8, "max_num_batched_tokens": 4}))


def test_chat_without_max_tokens_stops_at_the_cap_or_the_context(env: Env) -> None:
    """The gateway caps a chat that sets no limit (quotas.default_max_tokens, 1024); where the
    prompt leaves less room than that, the engine stops at the context's end instead of refusing."""
    client = env.client()
    words = " ".join(["train"] * 1800)
    probe = client.chat.completions.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": words}])
    assert probe.usage is not None
    room = env.backend.engine.max_model_len - probe.usage.prompt_tokens
    assert 0 < room < 1024, room  # the prompt leaves less than the cap
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": words}],
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == room
