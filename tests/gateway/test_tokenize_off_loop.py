"""``/tokenize`` and ``/v1/messages/count_tokens`` tokenize a huge input off the event loop: while
the engine's tokenizer works on it, the gateway still answers ``/healthz``; the huge request then
gets the same count as the tokenizer gives."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from backends.openai_wire import ChatCompletionRequest
from gateway.off_loop import OFF_LOOP_BOUND
from tests.support.local_gateway import KEY, local_gateway

HUGE = "lorem ipsum dolor sit amet " * (2 * OFF_LOOP_BOUND // 27)  # past the bound: tokenized in a thread
MESSAGES = [{"role": "user", "content": HUGE}]
CASES = {
    "tokenize-prompt": ("/tokenize", {"model": "tiny", "prompt": HUGE}, "tokenize_text"),
    "tokenize-messages": ("/tokenize", {"model": "tiny", "messages": MESSAGES}, "tokenize_chat"),
    "count-tokens": ("/v1/messages/count_tokens", {"model": "tiny", "max_tokens": 1, "messages": MESSAGES},
                     "tokenize_chat"),
}


@pytest.mark.parametrize("case", CASES)
def test_health_is_answered_while_a_huge_input_is_tokenized(case: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path, body, method = CASES[case]
    working, release = threading.Event(), threading.Event()
    with local_gateway(tmp_path) as env:
        tokenize = getattr(env.backend, method)
        chat = msgspec.convert({"model": "tiny", "messages": MESSAGES}, ChatCompletionRequest)
        expected = len(tokenize(HUGE) if method == "tokenize_text" else tokenize(chat))

        def held(subject: str | ChatCompletionRequest, *args: Any, **kwargs: Any) -> list[int]:
            """The engine's own tokenizer, held at the huge input until the test releases it."""
            text = subject if isinstance(subject, str) else subject.messages[0].text()
            if len(text) > OFF_LOOP_BOUND and not working.is_set():
                working.set()
                release.wait(30)
            return tokenize(subject, *args, **kwargs)

        monkeypatch.setattr(env.backend, method, held)
        headers = {"authorization": f"Bearer {KEY}"}
        with ThreadPoolExecutor(1) as pool:
            huge = pool.submit(httpx.post, env.server.url + path, json=body, headers=headers, timeout=60)
            try:
                assert working.wait(30), "the huge input was never tokenized"
                assert httpx.get(env.server.url + "/healthz", timeout=10).status_code == 200
                assert not huge.done()  # answered while the huge input was still being tokenized
            finally:
                release.set()
            answer = huge.result(timeout=60)
    assert answer.status_code == 200, answer.text
    counted = answer.json()
    assert (counted["count"] if path == "/tokenize" else counted["input_tokens"]) == expected
