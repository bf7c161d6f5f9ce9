"""Text through the engine on the built-in tiny model: detokenised output, stop strings cut
off (also when they span tokens), streamed text deltas, text prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, AsyncEngine, SamplingParams
from engine.structured_output import StructuredOutput
from engine.tiny_model import build_tiny_model

PROMPT = "Hello there, how are you?"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path: Path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return LLM(str(path), num_kv_blocks=256, max_model_len=512)


def free_run(llm: LLM, n: int = 30) -> tuple[str, list[int]]:
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].outputs[0]
    return out.text, out.token_ids


def test_text_is_the_decoded_tokens(llm: LLM) -> None:
    text, tokens = free_run(llm)
    assert text and text == llm.tokenizer.decode(tokens)


def spanning_stop(llm: LLM, text: str, tokens: list[int]) -> str:
    """A 4-character piece of ``text`` that straddles a token boundary."""
    for k in range(2, len(tokens)):
        head = llm.tokenizer.decode(tokens[:k])
        b = len(head)
        piece = text[b - 2 : b + 2]
        if text.startswith(head) and b >= 4 and len(piece) == 4 and "\ufffd" not in piece:
            return piece
    raise AssertionError("no clean token boundary in the sample text")


def test_stop_string_spanning_tokens_is_cut_from_the_output(llm: LLM) -> None:
    text, tokens = free_run(llm)
    stop = spanning_stop(llm, text, tokens)
    out = llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]


def test_stop_strings_wait_for_min_tokens(llm: LLM) -> None:
    """As vLLM: before min_tokens output tokens no stop string ends the sequence; one that ends
    later still does, cut cleanly."""
    text, tokens = free_run(llm)
    stop = spanning_stop(llm, text, tokens)
    early = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]))
    k = len(early[0].outputs[0].token_ids)  # the stop string ends in token k
    min_tokens = k + 3
    out = llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop], min_tokens=min_tokens)
    )[0].outputs[0]
    assert len(out.token_ids) >= min_tokens
    assert out.token_ids == tokens[: len(out.token_ids)]
    assert text.startswith(out.text) and len(out.text) > text.index(stop)
    if out.finish_reason == "stop":
        assert text[len(out.text) :].startswith(stop)
    else:
        assert out.finish_reason == "length" and out.text == text


async def test_streamed_text_deltas_add_up(llm: LLM) -> None:
    text, _ = free_run(llm, 20)
    eng = AsyncEngine(engine=llm.engine)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    pieces = [o.outputs[0].delta_text async for o in eng.add_request("stream", PROMPT, params)]
    assert "".join(pieces) == text
    await eng.shutdown()


def test_included_stop_string_stays_in_the_output(llm: LLM) -> None:
    """vLLM's include_stop_str_in_output: cut right after the stop string; same tokens either way."""
    text, tokens = free_run(llm)
    stop = spanning_stop(llm, text, tokens)
    base = dict(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    cut = llm.generate([PROMPT], SamplingParams(**base))[0].outputs[0]  # type: ignore[arg-type]
    kept = llm.generate([PROMPT], SamplingParams(**base, include_stop_str_in_output=True))[0].outputs[0]  # type: ignore[arg-type]
    assert kept.text == text[: text.index(stop) + len(stop)] and kept.finish_reason == "stop"
    assert kept.stop_reason == stop and kept.token_ids == cut.token_ids


def test_stop_token_text_is_included_as_vllm_decodes_it(llm: LLM) -> None:
    """A stop token id or EOS that ends the sequence is decoded into the text only with
    include_stop_str_in_output, and a special one only without skip_special_tokens."""
    text, tokens = free_run(llm)
    k = next(k for k in range(1, len(tokens)) if tokens[k] not in tokens[:k]  # whole characters either way
             and not any(llm.tokenizer.decode(tokens[:j]).endswith("\ufffd") for j in (k, k + 1)))
    base = dict(temperature=0, max_tokens=30, stop_token_ids=[tokens[k]])
    for include, want in ((False, tokens[:k]), (True, tokens[: k + 1])):
        out = llm.generate([PROMPT], SamplingParams(**base, include_stop_str_in_output=include))[0].outputs[0]  # type: ignore[arg-type]
        assert out.text == llm.tokenizer.decode(want) and out.stop_reason == tokens[k]
        assert out.token_ids == tokens[: k + 1]
    eos = sorted(llm.tokenizer.eos_token_ids)[0]
    forced = dict(temperature=0, max_tokens=5, logit_bias={eos: 100.0})
    for include, skip, eos_text in ((True, False, llm.tokenizer.decode([eos], skip_special_tokens=False)),
                                    (True, True, ""), (False, False, "")):
        out = llm.generate([PROMPT], SamplingParams(**forced, include_stop_str_in_output=include,  # type: ignore[arg-type]
                                                    skip_special_tokens=skip))[0].outputs[0]
        assert out.token_ids == [eos] and out.text == eos_text, (include, skip)


SUN = "\U0001f31e"  # four UTF-8 bytes: more than one token of the tiny byte-level tokenizer


@pytest.mark.parametrize("how", ["length", "stop_token"])
async def test_an_answer_cut_inside_a_character_ends_in_u_fffd(llm: LLM, how: str) -> None:
    """A sequence that ends (max_tokens, a stop token) after a token holding part of a character
    shows that part as U+FFFD, as decoding its tokens does, streamed as not: its bytes were dropped."""
    forced = dict(temperature=0, structured=StructuredOutput("regex", f"ab{SUN}"))
    whole = llm.generate([PROMPT], SamplingParams(**forced, max_tokens=12))[0].outputs[0]  # type: ignore[arg-type]
    assert whole.text == f"ab{SUN}"
    k = next(k for k in range(1, len(whole.token_ids)) if llm.tokenizer.decode(whole.token_ids[:k]).endswith("\ufffd"))
    ends = dict(max_tokens=k) if how == "length" else dict(max_tokens=12, stop_token_ids=[whole.token_ids[k]])
    params = SamplingParams(**forced, **ends)  # type: ignore[arg-type]
    out = llm.generate([PROMPT], params)[0].outputs[0]
    assert out.text == "ab\ufffd" == llm.tokenizer.decode(whole.token_ids[:k])
    assert out.finish_reason == ("length" if how == "length" else "stop")
    eng = AsyncEngine(engine=llm.engine)
    pieces = [o.outputs[0].delta_text async for o in eng.add_request(f"cut-{how}", PROMPT, params)]
    await eng.shutdown()
    assert "".join(pieces) == out.text
    cut = llm.generate([PROMPT], SamplingParams(**forced, **ends, stop=["\ufffd"]))[0].outputs[0]  # type: ignore[arg-type]
    assert cut.text == "ab" and cut.finish_reason == out.finish_reason  # no text holds a stop string
