"""vLLM's ``prompt_logprobs`` on the wire, its extension of chat and text completions.

A list with one entry per prompt token: the first ``null`` (nothing predicts it), each other a
mapping from token id (a string key, as JSON has them) to a ``PromptLogprob``: the prompt token
itself, then the ``k`` most likely tokens at its position. A text completion's choices each carry
it; a chat completion carries it once, at the top level (vLLM's ``ChatCompletionResponse``).
"""

from __future__ import annotations

from msgspec import Struct


class PromptLogprob(Struct, kw_only=True):
    logprob: float
    rank: int | None = None  # the token's place in the vocabulary by logprob (1: the most likely)
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]
