"""The engine's exceptions. Each carries the request field at fault (``param``), so a caller maps
types, never message text: ``InvalidRequest`` (malformed: a 400), ``RequestRejected`` (can never
fit this model's context or KV cache), ``RequestFailed`` (one request broke down mid-run; the
others go on), ``EngineClosed`` (shut down: try elsewhere)."""

from __future__ import annotations


class EngineError(Exception):
    """A message names the field at fault as ``param`` spells it (``SamplingParams``' names), so a
    front end whose clients call it otherwise can say it their way."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault (e.g. "max_tokens"); None: the prompt itself


class InvalidRequest(EngineError, ValueError):
    """A request the engine cannot run as given (a bad sampling value, a token id off the vocabulary)."""


class RequestRejected(InvalidRequest):
    """A request that could never fit: its prompt plus ``max_tokens`` exceed the model's context or
    the whole KV cache (``param`` is "max_tokens" when a smaller limit would fit)."""


class ChatTemplateError(InvalidRequest):
    """The model has no chat template, or the template refused the conversation."""

    def __init__(self, message: str, *, param: str | None = "messages") -> None:
        super().__init__(message, param=param)


class RequestFailed(EngineError, RuntimeError):
    """One request failed while it ran (sampling its row raised), not the engine: the step's other
    requests go on. A request whose own input turns out unusable mid-run (its grammar breaks
    down) fails with ``InvalidRequest`` instead."""


class EngineClosed(EngineError, RuntimeError):
    """The engine is shut down (or its step loop failed) and takes no more requests."""
