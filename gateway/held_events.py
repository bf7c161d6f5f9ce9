"""``GET /v1/responses/{id}?stream=true`` of a background response an upstream still runs
(``gateway.held_responses``): the upstream's own event stream of it, from its start or after the
client's ``starting_after`` (the query passed on as the client sent it), relayed as a streamed
``POST``'s is (``SSERelay`` with the Responses dialect's ``RelayedEvents``: the model named as the
client named it). Its last event (``FINAL_EVENTS``) stores it finished and meters it before that
event is sent (``finish_if_ended``: once, so a poll, the follower or another stream of it that finds
it ended first does it instead); a stream cut before then meters nothing, the response held on (cut
by the gateway, it ends telling its client so: ``gateway.dialects.responses_resume``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar.background_tasks import BackgroundTask

from backends.base import Meter
from gateway.contracts import Principal
from gateway.dialects.responses import RelayedEvents
from gateway.errors import ApiError
from gateway.event_stream import EventStream
from gateway.held_responses import finish_if_ended, holder, named
from gateway.pipeline import Pipeline
from gateway.stored_responses import Kept, ResponseStore
from gateway.streaming import Outcome, SavedBeforeLast, SSERelay

log = logging.getLogger("switchyard.responses")


async def held_events(pipeline: Pipeline, store: ResponseStore, principal: Principal, response_id: str, kept: Kept,
                      query: str, headers: dict[str, str]) -> EventStream:
    """The event stream of ``kept``, a response its deployment holds, asked for with the client's
    ``query`` (``headers`` added to its answer's); a failure before its first event raises (the
    upstream's 404: ``BackendError``)."""
    fields = named(kept)
    backend = holder(pipeline, principal, fields["model"], kept.deployment, response_id)
    stream = await backend.held_stream(response_id, query)
    ended: list[dict[str, Any]] = []  # the response, as its last event tells it
    encoder = RelayedEvents(stream.meter, {}, {"previous_response_id": fields["previous_response_id"]},
                            lambda final, _: ended.append(final), held=lambda: response_id)

    async def on_end(_: Meter, outcome: Outcome, error: ApiError | None) -> None:
        """Nothing to settle: the response's spend is metered when it ends, not per stream of it."""
        if error is not None:
            log.warning("the stream of background response %s failed: %s", response_id, error.message)

    async def finish() -> None:
        try:  # shielded: the client leaving while it is stored and metered does not cut that short
            await asyncio.shield(finish_if_ended(pipeline, store, principal, response_id, ended[0]))
        except Exception:  # the database is down: still held, the follower (or a poll) finishes it
            log.exception("storing the end of background response %s failed", response_id)

    relay = SSERelay(stream, fields["model"], on_end, encoder, keepalives=pipeline.keepalives)
    return EventStream(SavedBeforeLast(relay, ended, finish),
                       headers=headers | {"cache-control": "no-cache", "x-accel-buffering": "no"},
                       background=BackgroundTask(relay.finish))
