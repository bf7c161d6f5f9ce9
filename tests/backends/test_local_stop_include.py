"""vLLM's ``include_stop_str_in_output`` on the built-in engine, through the gateway with the openai
SDK: the text is the stop-free run's text cut right after the first stop string (true) or right
before it (false), streamed or not, on both endpoints, for every choice; finish_reason and
stop_reason still name the stop string and the usage does not change."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.local_gateway import Env, local_gateway

PROMPT = "Hello there, how are you?"
GREEDY = {"temperature": 0.0, "max_tokens": 24, "n": 2}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("stop-include")) as s:
        yield s


def create(env: Env, chat: bool, stream: bool, **extra: Any) -> tuple[dict[int, str], dict[int, Any], int]:
    """Each choice's text and its finish chunk (or choice), and the completion tokens."""
    client = env.client()
    body: dict[str, Any] = {"ignore_eos": True, **extra}
    options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    if chat:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                               extra_body=body, **GREEDY, **options)  # type: ignore[call-overload]
    else:
        reply = client.completions.create(model="tiny", prompt=PROMPT, extra_body=body,
                                          **GREEDY, **options)  # type: ignore[call-overload]
    if not stream:
        texts = {c.index: c.message.content if chat else c.text for c in reply.choices}
        return texts, {c.index: c for c in reply.choices}, reply.usage.completion_tokens
    texts, ends, tokens = {0: "", 1: ""}, {}, -1
    for chunk in reply:
        for c in chunk.choices:
            texts[c.index] += (c.delta.content if chat else c.text) or ""
            if c.finish_reason is not None:
                ends[c.index] = c
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return texts, ends, tokens


def stop_string(text: str) -> str:
    """Three whole characters well inside ``text`` (so the stop string surely occurs)."""
    for i in range(3, len(text) - 3):
        piece = text[i : i + 3]
        if "\ufffd" not in piece and piece.strip() == piece and text.index(piece) >= 3:
            return piece
    raise AssertionError(f"no clean stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
def test_stop_string_is_kept_or_cut_as_asked(env: Env, chat: bool, stream: bool) -> None:
    free, _, _ = create(env, chat, False)
    assert free[0] == free[1]  # greedy: both choices are the same text
    stop = stop_string(free[0])
    at = free[0].index(stop)
    runs = {include: create(env, chat, stream, stop=[stop], include_stop_str_in_output=include)
            for include in (True, False)}
    for include, (texts, ends, _) in runs.items():
        want = free[0][: at + len(stop)] if include else free[0][:at]
        assert texts == {0: want, 1: want}, include
        assert {i: e.finish_reason for i, e in ends.items()} == {0: "stop", 1: "stop"}
        assert {i: e.model_extra["stop_reason"] for i, e in ends.items()} == {0: stop, 1: stop}
    assert runs[True][2] == runs[False][2] > 0  # the same tokens either way


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_stop_string_whose_characters_come_one_at_a_time_is_kept(env: Env, stream: bool) -> None:
    """A stop string of more than three characters arriving a character at a time (an emoji is
    several byte tokens) is found and kept, not missed until the length limit."""
    sun = "\U0001f31e"
    texts, ends, _ = create(env, False, stream, guided_regex=sun * 6, stop=[sun * 4], include_stop_str_in_output=True)
    assert texts == {0: sun * 4, 1: sun * 4}
    assert {i: (e.finish_reason, e.model_extra["stop_reason"]) for i, e in ends.items()} == {
        0: ("stop", sun * 4), 1: ("stop", sun * 4)}
