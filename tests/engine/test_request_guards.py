"""One request's parameters never break the engine or its batch mates: token ids off the
vocabulary are refused on entry (stop_token_ids as prompt ids and logit_bias already were), a huge
top_k and a tiny temperature are safe, a row the sampler cannot draw fails only its own request,
and a grammar the grammar engine gives up on mid-answer fails its request instead of ending "stop"."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, AsyncEngine, InvalidRequest, RequestFailed, SamplingParams
from engine.sampler import Sampler, SamplingRow
from engine.structured_output import StructuredOutput
from engine.tiny_model import build_tiny_model

VOCAB = 1024  # the tiny model's
PROMPTS = ["Hello there", "The train left the station", "Once upon a time"]
# No finite JSON value matches it: llguidance errs ("Too many items") after the first token.
ENDLESS = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
           "$ref": "#/$defs/n"}
# More alternatives than an Earley row holds (2000): the matcher errs after the first token.
WIDE_LARK = "start: " + " | ".join(json.dumps(f"opt{i}") for i in range(2500))


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path: Path = build_tiny_model(tmp_path_factory.mktemp("guards"), seed=0)
    return LLM(str(path), num_kv_blocks=256, max_model_len=512)


def assert_idle(llm: LLM) -> None:
    bm = llm.engine.block_manager
    assert not llm.engine.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_blocks


def greedy_texts(llm: LLM, max_tokens: int = 8) -> list[list[int]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


# -- token ids ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ids", [[VOCAB], [99999999], [-1], [5, VOCAB + 3]])
def test_stop_token_ids_off_the_vocabulary_are_a_400_naming_the_field(llm: LLM, ids: list[int]) -> None:
    with pytest.raises(InvalidRequest) as info:
        llm.engine.processor.process("x", "Hi", SamplingParams(min_tokens=2, max_tokens=4, stop_token_ids=ids))
    assert info.value.param == "stop_token_ids" and f"[0, {VOCAB})" in info.value.message
    with pytest.raises(InvalidRequest):
        llm.generate(["Hi"], SamplingParams(min_tokens=1, max_tokens=2, stop_token_ids=ids))
    assert_idle(llm)


def test_in_vocabulary_stop_token_ids_with_min_tokens_still_work(llm: LLM) -> None:
    p = SamplingParams(temperature=0, min_tokens=3, max_tokens=6, stop_token_ids=[VOCAB - 1, 0])
    c = llm.generate(["Hi"], p)[0].outputs[0]
    assert len(c.token_ids) >= 3 and not set(c.token_ids[:3]) & {VOCAB - 1, 0}


def test_min_tokens_past_what_the_context_leaves_is_refused_without_max_tokens(llm: LLM) -> None:
    """Without max_tokens the output may run to the context's end; a min_tokens past that cannot
    be honoured (it was taken, and the answer ended "length" short of it). As vLLM, whose
    max_tokens then defaults to what the context leaves: an error naming min_tokens."""
    prompt = llm.tokenizer.encode("Hi")
    room = 512 - len(prompt)
    with pytest.raises(InvalidRequest) as info:
        llm.engine.processor.process("x", prompt, SamplingParams(max_tokens=None, min_tokens=room + 1))
    assert info.value.param == "min_tokens" and str(room) in info.value.message
    out = llm.generate([prompt], SamplingParams(max_tokens=None, min_tokens=room, ignore_eos=False))[0]
    assert len(out.outputs[0].token_ids) == room
    assert_idle(llm)


def test_sampler_never_indexes_with_an_id_off_the_vocabulary() -> None:
    """Defence in depth for callers that skip the input processor: the min_tokens ban ignores ids
    the logits have no column for (as logit_bias does), instead of failing the whole batch."""
    torch.manual_seed(0)
    logits = torch.randn(2, 50)
    rows = [SamplingRow(SamplingParams(temperature=0), [1], [], None, [3, 99999999, -7]),
            SamplingRow(SamplingParams(temperature=0), [1], [], None, [])]
    out = Sampler("cpu")(logits, rows)
    masked = logits[0].clone()
    masked[3] = float("-inf")
    assert out.token_ids == [int(masked.argmax()), int(logits[1].argmax())]


# -- a row the sampler cannot draw fails its own request only -----------------------------------

def test_a_row_that_cannot_be_sampled_fails_only_its_request(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    want = greedy_texts(llm)
    runner = llm.engine.runner
    row = runner._row

    def poisoned(item: Any) -> SamplingRow:
        if item.seq.params.seed == 666:
            raise IndexError("index 99999999 is out of bounds")
        return row(item)

    monkeypatch.setattr(runner, "_row", poisoned)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    bad = SamplingParams(temperature=0, max_tokens=8, seed=666, n=2)
    outs = llm.generate(PROMPTS + ["Hi"], [greedy] * len(PROMPTS) + [bad])
    assert [o.outputs[0].token_ids for o in outs[:-1]] == want
    assert all(o.error is None for o in outs[:-1])
    failed = outs[-1]
    assert isinstance(failed.error, RequestFailed) and "out of bounds" in failed.error.message
    assert failed.finished and [c.finish_reason for c in failed.outputs] == ["error", "error"]
    assert_idle(llm)


# -- top_k and temperature ---------------------------------------------------------------------

def test_huge_top_k_means_no_top_k(llm: LLM) -> None:
    assert SamplingParams(top_k=2**63).top_k == 0
    assert SamplingParams(top_k=2**31 - 1).top_k == 2**31 - 1
    base = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    huge = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, top_k=2**63)
    assert llm.generate(["Hi"], huge)[0].outputs[0].token_ids == llm.generate(["Hi"], base)[0].outputs[0].token_ids


def test_sampler_takes_a_top_k_past_the_vocabulary() -> None:
    """A top_k set after validation (or >= the vocabulary) keeps every token, never overflows."""
    logits = torch.randn(1, 50)
    drawn = []
    for k in (0, 50, 10**6, 2**63):
        params = SamplingParams(temperature=1.0)
        params.top_k = k
        g = torch.Generator()
        g.manual_seed(4)
        drawn.append(Sampler("cpu")(logits, [SamplingRow(params, [1], [], g, [])]).token_ids)
    assert drawn[1:] == drawn[:1] * 3


@pytest.mark.parametrize("temperature", [1e-6, 1e-20, 1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy(llm: LLM, temperature: float) -> None:
    assert SamplingParams(temperature=temperature).greedy
    p = SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, p)] == greedy_texts(llm)


def test_a_small_temperature_above_the_epsilon_still_samples() -> None:
    assert not SamplingParams(temperature=1e-3).greedy
    logits = torch.tensor([[5.0, 4.999, -3.0]])
    p = SamplingParams(temperature=1e-3)
    out = Sampler("cpu")(logits, [SamplingRow(p, [1], [], None, [])])
    assert out.token_ids[0] in (0, 1)


# -- grammars the grammar engine gives up on ------------------------------------------------------

@pytest.mark.parametrize("so", [
    StructuredOutput("grammar", WIDE_LARK, "guided_grammar"),
    StructuredOutput("json", json.dumps(ENDLESS), "response_format.json_schema.schema"),
])
def test_a_grammar_that_errs_mid_answer_fails_the_request_not_stop(llm: LLM, so: StructuredOutput) -> None:
    for temperature in (0.0, 1.0):
        bad = SamplingParams(temperature=temperature, seed=1, max_tokens=8, structured=so)
        good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        outs = llm.generate(["Hi"] + PROMPTS, [bad] + [good] * len(PROMPTS))
        failed = outs[0]
        assert isinstance(failed.error, InvalidRequest) and failed.error.param == so.param
        assert "grammar engine failed" in failed.error.message
        assert failed.outputs[0].finish_reason == "error"
        assert [o.outputs[0].token_ids for o in outs[1:]] == greedy_texts(llm)
    assert_idle(llm)


def test_async_engine_raises_the_grammar_error_on_the_stream(llm: LLM) -> None:
    so = StructuredOutput("grammar", WIDE_LARK, "guided_grammar")

    async def run() -> tuple[BaseException | None, int]:
        engine = AsyncEngine(engine=llm.engine)
        good = engine.add_request("good", "Hi", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        bad = engine.add_request("bad", "Hi", SamplingParams(temperature=0, max_tokens=6, structured=so))
        error = None
        try:
            async for _ in bad:
                pass
        except InvalidRequest as exc:
            error = exc
        outs = [o async for o in good]
        await engine.shutdown()
        return error, len(outs[-1].outputs[0].token_ids)

    error, good_tokens = asyncio.run(run())
    assert isinstance(error, InvalidRequest) and error.param == "guided_grammar"
    assert good_tokens == 6
    assert_idle(llm)


def test_choice_takes_thousands_of_options(llm: LLM) -> None:
    choices = [f"opt{i}" for i in range(2500)]
    so = StructuredOutput("choice", json.dumps(choices), "guided_choice")
    for seed in range(3):
        out = llm.generate(["Hi"], SamplingParams(temperature=1.0, seed=seed, max_tokens=12, structured=so))[0]
        assert out.error is None and out.outputs[0].finish_reason == "stop"
        assert out.outputs[0].text in choices


def test_choice_matches_options_with_regex_characters_literally(llm: LLM) -> None:
    choices = ["a.b", "(x)|y", "1+1=2?", "[z]", "{q}", "^$", "a b", "#c", "p-q", "t~&", "back\\slash", "x*"]
    manager = llm.engine.processor.structured()
    tokenizer = llm.engine.tokenizer
    so = StructuredOutput("choice", json.dumps(choices), "guided_choice")
    for choice in choices:
        matcher = manager.matcher(so)
        for token in tokenizer.encode(choice, add_special_tokens=False):
            assert matcher.consume_token(token), choice
        assert matcher.is_accepting() and not matcher.is_error(), choice
    for near in ("aXb", "y", "11=2", "z"):
        matcher = manager.matcher(so)
        ok = all(matcher.consume_token(t) for t in tokenizer.encode(near, add_special_tokens=False))
        assert not (ok and matcher.is_accepting()), near
    for seed in range(4):
        p = SamplingParams(temperature=1.0, seed=seed, max_tokens=12, structured=so)
        assert llm.generate(["Hi"], p)[0].outputs[0].text in choices
