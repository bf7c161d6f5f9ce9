"""A chat prompt served by the in-process engine is rendered and tokenized once: the ids admission
counted for its reservation are the ids the engine is given (it rendered them twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.local_gateway import local_gateway


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_prompt_is_tokenized_once_per_request(stream: bool, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with local_gateway(tmp_path) as env:
        tokenizer = env.backend.tokenizer
        render = tokenizer.apply_chat_template
        renders: list[int] = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            ids = render(*args, **kwargs)
            renders.append(len(ids))
            return ids

        monkeypatch.setattr(tokenizer, "apply_chat_template", counted)
        client = env.client()
        messages = [{"role": "user", "content": "hello there"}]
        if stream:
            chunks = list(client.chat.completions.create(model="tiny", max_tokens=2, messages=messages,  # type: ignore[arg-type]
                                                         stream=True, stream_options={"include_usage": True}))
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(model="tiny", max_tokens=2, messages=messages).usage  # type: ignore[arg-type]
        env.wait_idle()
    assert usage is not None
    assert renders == [usage.prompt_tokens]  # once, for admission; the engine got those very ids
    assert [s.ticket.reserved_tokens for s in env.admission.settled] == [usage.prompt_tokens + 2]  # exact
