"""Token estimates for providers that do not report usage (marked ``Meter.exact = False``).

A character heuristic (about four characters per token for English text, never less than one
token per word-ish piece) keeps the gateway free of per-provider tokenizers; it is used only for
quota reservations and for metering when the upstream gives no usage.
"""

from __future__ import annotations

from backends.embeddings_wire import EmbeddingRequest
from backends.openai_wire import ChatCompletionRequest, CompletionRequest

_PER_MESSAGE_OVERHEAD = 4  # role and separators, as chat templates add them


def estimate_text(text: str) -> int:
    if not text:
        return 0
    return max(len(text.split()), (len(text) + 3) // 4)


def estimate_chat_prompt(request: ChatCompletionRequest) -> int:
    return sum(_PER_MESSAGE_OVERHEAD + estimate_text(m.text()) for m in request.messages)


def estimate_completion_prompt(request: CompletionRequest) -> int:
    try:
        prompts = request.prompts()
    except ValueError:
        return 0
    total = 0
    for prompt in prompts:
        total += estimate_text(prompt) if isinstance(prompt, str) else len(prompt)
    return total


def estimate_embedding_input(request: EmbeddingRequest) -> int:
    try:
        inputs = request.inputs()
    except ValueError:
        return 0
    return sum(estimate_text(i) if isinstance(i, str) else len(i) for i in inputs)
