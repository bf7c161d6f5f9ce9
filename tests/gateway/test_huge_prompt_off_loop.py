"""A huge prompt is counted for its reservation off the event loop: while the engine's tokenizer
counts it, the gateway still answers ``/healthz`` and other tenants' requests; the huge request
then gets its own answer, and exact reservations are unchanged."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.openai_wire import ChatCompletionRequest
from gateway.off_loop import OFF_LOOP_BOUND
from tests.support.local_gateway import local_gateway

HUGE = "lorem ipsum dolor sit amet " * (2 * OFF_LOOP_BOUND // 27)  # past the bound: counted in a thread


def test_health_is_answered_while_a_huge_prompt_is_being_counted(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counting, release = threading.Event(), threading.Event()
    with local_gateway(tmp_path) as env:
        tokenize_chat = env.backend.tokenize_chat

        def held(request: ChatCompletionRequest, *args: Any, **kwargs: Any) -> list[int]:
            """The engine's own tokenizer, held at the first huge prompt until the test releases it."""
            if len(request.messages[0].text()) > OFF_LOOP_BOUND and not counting.is_set():
                counting.set()
                release.wait(30)
            return tokenize_chat(request, *args, **kwargs)

        monkeypatch.setattr(env.backend, "tokenize_chat", held)
        client = env.client()
        with ThreadPoolExecutor(1) as pool:
            huge = pool.submit(client.chat.completions.create, model="tiny", max_tokens=1,
                               messages=[{"role": "user", "content": HUGE}])
            try:
                assert counting.wait(30), "the huge prompt was never counted"
                assert httpx.get(env.server.url + "/healthz", timeout=10).status_code == 200
                small = client.with_options(timeout=10).chat.completions.create(
                    model="tiny", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
                assert small.usage is not None and small.usage.completion_tokens == 1
                assert not huge.done()  # both answered while the huge prompt was still being counted
            finally:
                release.set()
            with pytest.raises(openai.BadRequestError) as refused:
                huge.result(timeout=60)
        env.wait_idle()
    assert refused.value.code == "context_length_exceeded"  # the tiny model's context is 2048 tokens
