"""Property tests of streamed text: incremental detokenisation of multi-byte UTF-8 (emoji, CJK,
combining marks) split over byte-level tokens, and stop strings cut across any chunking."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.detok import IncrementalDetokenizer, StopMatcher
from engine.tiny_model import build_tiny_model
from engine.tokenizer import Tokenizer

ALPHABET = list("ab 月日本😀🚂é\u0301\n")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path: Path = build_tiny_model(tmp_path_factory.mktemp("detok"), num_hidden_layers=1)
    return Tokenizer(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(alphabet=ALPHABET, max_size=6), answer=st.text(alphabet=ALPHABET, min_size=1, max_size=12))
def test_streamed_pieces_add_up_to_the_decoded_answer_and_never_split_a_character(
        tok: Tokenizer, prompt: str, answer: str) -> None:
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    whole = tok.encode(prompt + answer, add_special_tokens=False)
    assume(whole[: len(prompt_ids)] == prompt_ids)  # else the answer merged into the prompt's last token
    ids = whole[len(prompt_ids):]
    detok = IncrementalDetokenizer(tok, prompt_ids)
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    full = tok.decode(prompt_ids + ids)
    assert "".join(pieces) == detok.text == full[len(tok.decode(prompt_ids)):]


TEXT = st.text(alphabet=ALPHABET, max_size=6)


@settings(max_examples=1000, deadline=None)
@given(chunks=st.lists(TEXT, max_size=8), stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=3),
                                                          min_size=1, max_size=3), include=st.booleans())
def test_stop_strings_cut_the_text_at_the_first_one_whatever_the_chunking(
        chunks: list[str], stops: list[str], include: bool) -> None:
    m = StopMatcher(stops, include=include)
    out = ""
    for chunk in chunks:
        emit, stopped = m.feed(chunk)
        out += emit
        if stopped:
            break
    text = "".join(chunks)
    if not m.stopped:
        assert out + m.flush() == text and not any(s in text for s in stops)
        return
    assert m.matched in stops
    body = out[: len(out) - len(m.matched)] if include else out
    assert text.startswith(body + m.matched) and out in (body, body + m.matched)
    assert not any(s in body for s in stops)  # nothing before the cut holds a whole stop string


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(alphabet=ALPHABET, max_size=6), answer=st.text(alphabet=ALPHABET, min_size=1, max_size=12),
       data=st.data())
def test_an_answer_cut_inside_a_character_ends_in_u_fffd_as_its_tokens_decode(
        tok: Tokenizer, prompt: str, answer: str, data: st.DataObject) -> None:
    """Generation may end (length, EOS) after a token holding part of a character: ``flush`` gives
    the bytes held back for it as U+FFFD, so the text is what decoding all the tokens gives."""
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    whole = tok.encode(prompt + answer, add_special_tokens=False)
    assume(whole[: len(prompt_ids)] == prompt_ids)
    ids = whole[len(prompt_ids):]
    cut = data.draw(st.integers(1, len(ids)))
    detok = IncrementalDetokenizer(tok, prompt_ids)
    pieces = [detok.push(i) for i in ids[:cut]] + [detok.flush()]
    assert "".join(pieces) == detok.text == tok.decode(prompt_ids + ids[:cut])[len(tok.decode(prompt_ids)):]
    assert detok.flush() == ""
