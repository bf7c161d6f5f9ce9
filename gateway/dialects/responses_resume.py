"""What the client of a background response's stream is told when the gateway ends that stream
before the response's last event while the response runs on upstream, held by the gateway
(``gateway.held_streams``, ``gateway.held_events``): the upstream's connection broke, or the process
drains. Not that the response failed or is incomplete (it is neither), but that it still runs and
how to resume its stream from the last event sent (OpenAI's stream-and-reconnect), poll or cancel it."""

from __future__ import annotations

from backends.base import Timeout, Unavailable
from gateway.errors import ApiError

DRAINED_CODE = "server_shutting_down"  # the ``error`` event's code when the process's drain cut the stream


def runs_on(error: ApiError | None) -> bool:
    """Whether a held response's stream ending with ``error`` (None: cut by the drain) leaves it
    running upstream: the gateway's connection to the upstream broke or went silent, not the
    upstream saying it failed."""
    return error is None or isinstance(error.cause, Unavailable | Timeout)


def still_running(response_id: str, last_sequence: int | None, error: ApiError | None) -> tuple[str, str]:
    """The ``error`` event's code and message for a held response's stream cut by ``error`` (None:
    the drain) after the event numbered ``last_sequence`` (None: none numbered was sent)."""
    after = f"&starting_after={last_sequence}" if last_sequence is not None else ""
    why = error.message if error is not None else "the gateway is shutting down"
    code = (error.code or error.type) if error is not None else DRAINED_CODE
    return code, (f"the stream of response {response_id} ended early ({why}); the response is still running: "
                  f"resume its stream with GET /v1/responses/{response_id}?stream=true{after}, "
                  f"or retrieve or cancel it")
