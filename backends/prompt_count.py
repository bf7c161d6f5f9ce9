"""Counting a prompt with an upstream model's tokenizer, configured for an HTTP deployment
(``tokenizer:`` in its config: a ``tokenizer.json``, or a folder holding one).

The provider renders its own chat template, which the gateway does not have: messages are counted
with the tokenizer, plus the same template allowance as the byte bound (``backends.estimate``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from tokenizers import Tokenizer

from backends.estimate import BOUND_PER_CONVERSATION, BOUND_PER_MESSAGE
from backends.openai_wire import ChatCompletionRequest

GIL_FREE_CHARS = 16 * 1024  # a longer text is encoded with ``encode_batch``, which lets go of the GIL


class PromptCounter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: str) -> PromptCounter:
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        return cls(Tokenizer.from_file(str(file)))

    def count(self, text: str) -> int:
        if len(text) > GIL_FREE_CHARS:  # ``encode`` would hold the GIL (and so the event loop) throughout
            return len(self.tokenizer.encode_batch([text], add_special_tokens=False)[0])
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def count_chat(self, request: ChatCompletionRequest) -> int:
        total = BOUND_PER_CONVERSATION
        for m in request.messages:
            total += BOUND_PER_MESSAGE + self.count(m.text())
            if m.name:
                total += self.count(str(m.name))
            if m.tool_calls:
                total += self.count(msgspec.json.encode(m.tool_calls).decode())
        if request.tools:
            total += self.count(msgspec.json.encode(request.tools).decode())
        return total
