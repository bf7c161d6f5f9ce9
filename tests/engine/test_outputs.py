"""Per-sequence text state: deltas, stop strings spanning tokens, held-back text on finish."""

from __future__ import annotations

from engine.outputs import TextState
from engine.sampling_params import SamplingParams

PIECES = {1: "Hel", 2: "lo", 3: " wo", 4: "rld", 5: "!", 6: " E", 7: "N", 8: "D"}


class PieceTokenizer:
    """Each id decodes to a fixed piece of text."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids)


def run(tokens: list[int], stop: list[str]) -> tuple[TextState, list[bool], list[str]]:
    state = TextState(PieceTokenizer(), SamplingParams(stop=stop), [])
    stopped, deltas = [], []
    for t in tokens:
        stopped.append(state.push(t))
        deltas.append(state.take_delta())
        if stopped[-1]:
            break
    return state, stopped, deltas


def test_plain_text_streams_in_deltas() -> None:
    state, stopped, deltas = run([1, 2, 3, 4], [])
    assert not any(stopped)
    assert deltas == ["Hel", "lo", " wo", "rld"] and state.text == "Hello world"


def test_stop_string_spanning_tokens_is_cut() -> None:
    state, stopped, deltas = run([1, 2, 6, 7, 8, 5], [" END"])
    assert stopped == [False, False, False, False, True]
    assert state.text == "Hello" and "".join(deltas) == "Hello"
    assert deltas[2] == "" and deltas[3] == ""  # " E", "N" held back as a possible stop prefix


def test_held_back_text_is_released_when_generation_ends_otherwise() -> None:
    state, stopped, _ = run([1, 2, 6, 7], [" END"])
    assert not any(stopped) and state.text == "Hello"
    state.finish()
    assert state.take_delta() == " EN" and state.text == "Hello EN"


def test_without_a_tokenizer_text_stays_empty() -> None:
    state = TextState(None, SamplingParams(stop=["x"]), [1])
    assert state.push(1) is False and state.text == ""


def test_included_stop_string_stays_and_nothing_is_held_back() -> None:
    state = TextState(PieceTokenizer(), SamplingParams(stop=[" EN"], include_stop_str_in_output=True), [])
    deltas = []
    for t in [1, 2, 6, 7, 8]:
        stopped = state.push(t)
        deltas.append(state.take_delta())
        if stopped:
            break
    assert stopped and state.stop_reason == " EN"
    assert deltas == ["Hel", "lo", " E", "N"] and state.text == "Hello EN"


def test_stop_token_text_is_included_only_when_asked() -> None:
    """As vLLM: the token that ended the sequence (EOS or a stop token id) is decoded into the
    text with include_stop_str_in_output, never otherwise."""
    for include, want in ((False, "Hello"), (True, "Hello!")):
        state = TextState(PieceTokenizer(), SamplingParams(stop=["zz"], include_stop_str_in_output=include), [])
        state.push(1)
        state.push(2)
        state.stop(5, 5)
        assert state.text == want and state.stop_reason == 5
