"""OpenAI's Responses API passed through to an upstream that serves it (an ``openai`` deployment with
``responses_api: true``): the request goes as the client sent it (the upstream's model name, the
deployment's ``drop_params``/``rename_params``), the answer and every stream event come back as the
upstream sent them; only usage is read, for metering.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypeGuard

import msgspec

from backends.base import ChunkStream, Completed, Interrupted, Meter, RelayedFailure, Unavailable, UpstreamError
from backends.config import DeploymentConfig
from backends.estimate import estimate_text
from backends.http_upstream import HTTPUpstream, answered, raise_if_error, streamed
from backends.redaction import redact_error_event, redact_failure
from backends.responses_wire import FINAL_EVENTS, RelayedResponse, ResponsesEvent
from backends.sse import SSELines

# output items of calls the client runs, not the provider: the others (web_search_call, ...) are billed per call
_CLIENT_CALLS = frozenset({"function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call",
                           "apply_patch_call"})
# stream events whose ``delta`` is text the model generated: counted while no usage has come
_GENERATED_DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                               "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
                               "response.refusal.delta", "response.custom_tool_call_input.delta",
                               "response.code_interpreter_call_code.delta"})


def meter_tier(meter: Meter, response: dict[str, Any]) -> None:
    """The service tier a response says it was served at (``"service_tier": "priority"``), onto ``meter``."""
    if isinstance(tier := response.get("service_tier"), str) and tier:
        meter.service_tier = tier


def meter_usage(meter: Meter, usage: Any) -> tuple[bool, bool]:
    """Take the counts a Responses ``usage`` object holds into ``meter``, exact when it holds both;
    a count it lacks, or holds negative, stays as the meter has it (an estimate; no cached tokens).
    Whether it held input, and output."""
    if not isinstance(usage, dict):
        return False, False
    cached = 0
    if has_prompt := _counted(prompt := usage.get("input_tokens")):
        details = usage.get("input_tokens_details")
        meter.prompt_tokens = prompt
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        meter.cached_tokens = max(cached, 0)
    if has_completion := _counted(completion := usage.get("output_tokens")):
        meter.completion_tokens = completion
    meter.exact = has_prompt and has_completion and cached >= 0
    return has_prompt, has_completion


def _counted(count: Any) -> TypeGuard[int]:
    return isinstance(count, int) and count >= 0


def hosted_tool_calls(response: dict[str, Any]) -> dict[str, int]:
    """The calls of the provider's own tools among a response's output items (``web_search_call``,
    ``file_search_call``, ...), by tool: ``{"web_search": 2}``."""
    calls: dict[str, int] = {}
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if tool := _hosted_tool(item):
            calls[tool] = calls.get(tool, 0) + 1
    return calls


def _hosted_tool(item: Any) -> str | None:
    """The provider's tool an output item is a call of (``web_search`` for a ``web_search_call``), else None."""
    kind = item.get("type") if isinstance(item, dict) else None
    if isinstance(kind, str) and kind.endswith("_call") and kind not in _CLIENT_CALLS:
        return kind.removesuffix("_call")
    return None


def upstream_body(body: dict[str, Any], config: DeploymentConfig, stream: bool, output_cap: int | None) -> bytes:
    """The client's request for the upstream: its model name, ``stream`` as asked, the gateway's
    output cap where the client set none, and the deployment's parameter adjustments."""
    out = dict(body) | {"model": config.model}
    out.pop("stream", None)
    if stream:
        out["stream"] = True
    if out.get("max_output_tokens") is None and output_cap is not None:
        out["max_output_tokens"] = output_cap
    for name in config.drop_params:
        out.pop(name, None)
    for old, new in config.rename_params.items():
        if old in out:
            out[new] = out.pop(old)
    return msgspec.json.encode(out)


async def _object(http: HTTPUpstream, path: str, payload: bytes, headers: dict[str, str] | None,
                  field: str) -> tuple[dict[str, Any], Mapping[str, str]]:
    """The JSON object the upstream answers ``POST path`` with, redacted, and its head; one without
    ``field`` (an ``{"error": ...}`` object with a 2xx) fails as what it names."""
    answer = await http.post(path, payload, headers)
    raw = answer.body
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise UpstreamError(f"the upstream sent an invalid response: {exc}") from None
    if not isinstance(body, dict):
        raise UpstreamError("the upstream sent an invalid response")
    if field not in body:
        raise_if_error(raw)
    redact_failure(body)
    return body, answer.headers


async def respond(http: HTTPUpstream, payload: bytes, prompt_estimate: int,
                  headers: dict[str, str] | None) -> Completed[RelayedResponse]:
    body, head = await _object(http, "/responses", payload, headers, "status")
    meter = answer_meter(body, prompt_estimate)
    meter.first_token_at = time.perf_counter()
    return answered(RelayedResponse(body), meter, head)


async def count_input_tokens(http: HTTPUpstream, payload: bytes) -> dict[str, Any]:
    """The upstream's ``response.input_tokens`` object, as it came."""
    body, _ = await _object(http, "/responses/input_tokens", payload, None, "input_tokens")
    if not isinstance(body.get("input_tokens"), int):
        raise UpstreamError("the upstream sent no input_tokens")
    return body


async def compact(http: HTTPUpstream, payload: bytes, prompt_estimate: int,
                  headers: dict[str, str] | None) -> Completed[RelayedResponse]:
    """The upstream's ``response.compaction`` object, as it came, metered from its usage (the prompt
    ``prompt_estimate`` and no output where it reports none)."""
    body, head = await _object(http, "/responses/compact", payload, headers, "output")
    meter = Meter(prompt_tokens=prompt_estimate, exact=False)
    meter_tier(meter, body)
    meter_usage(meter, body.get("usage"))
    meter.first_token_at = time.perf_counter()
    return answered(RelayedResponse(body), meter, head)


def answer_meter(body: dict[str, Any], prompt_estimate: int) -> Meter:
    """What a whole ``response`` object says it spent: its usage, exact where it holds both counts;
    the prompt ``prompt_estimate`` and the output estimated from its text where it does not."""
    meter = Meter(tool_calls=hosted_tool_calls(body), exact=False)
    meter_tier(meter, body)
    has_prompt, has_completion = meter_usage(meter, body.get("usage"))
    if not has_prompt:
        meter.prompt_tokens = prompt_estimate
    if not has_completion:
        meter.completion_tokens = estimate_text(_output_text(body))
    return meter


async def held_response(http: HTTPUpstream, method: str, path: str) -> dict[str, Any]:
    """The upstream's JSON object answering ``method`` on ``path`` (a response it holds, a query as
    the client sent it), redacted; non-2xx -> typed error."""
    answer = await http.post(path, b"", None, method)
    try:
        body = msgspec.json.decode(answer.body)
    except (msgspec.DecodeError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise UpstreamError("the upstream sent an invalid response")
    redact_failure(body)
    return body


def _output_text(body: dict[str, Any]) -> str:
    """The text a response's output generated, the kinds ``_GENERATED_DELTAS`` stream: its messages'
    text and refusals, its reasoning's text and summaries, its function calls' arguments, custom tool
    calls' input and code interpreter calls' code."""
    output = body.get("output")
    texts: list[str] = []
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if isinstance(arguments := item.get("arguments"), str):
            texts.append(arguments)
        if item.get("type") == "custom_tool_call" and isinstance(tool_input := item.get("input"), str):
            texts.append(tool_input)
        if item.get("type") == "code_interpreter_call" and isinstance(code := item.get("code"), str):
            texts.append(code)
        parts = [p for key in ("content", "summary") if isinstance(ps := item.get(key), list) for p in ps]
        texts += [text for part in parts if isinstance(part, dict) for key in ("text", "refusal")
                  if isinstance(text := part.get(key), str)]
    return " ".join(texts)


async def respond_stream(http: HTTPUpstream, payload: bytes, prompt_estimate: int,
                         headers: dict[str, str] | None) -> ChunkStream[ResponsesEvent]:
    """Open the stream and read its first event, so failures before the first byte raise here."""
    return await _event_stream(http, "POST", "/responses", payload, prompt_estimate, headers)


async def held_stream(http: HTTPUpstream, path: str) -> ChunkStream[ResponsesEvent]:
    """The event stream of a response the upstream holds (``GET`` ``path``: its ``stream=true`` and
    any ``starting_after`` as the client sent them), opened as ``respond_stream`` opens one, but one
    with no event is an empty stream, as the upstream's (no event after ``starting_after``: the
    response ended with the one it numbers); its meter counts from no prompt (the response's own
    usage is what its end is metered with)."""
    return await _event_stream(http, "GET", path, b"", 0, None, may_be_empty=True)


async def _event_stream(http: HTTPUpstream, method: str, path: str, payload: bytes, prompt_estimate: int,
                        headers: dict[str, str] | None, may_be_empty: bool = False) -> ChunkStream[ResponsesEvent]:
    response, first_deadline, deadline = await http.open_stream(path, payload, headers, method)
    meter = Meter(prompt_tokens=prompt_estimate, exact=False)
    events = _Events(http, response, meter, deadline, may_be_empty)
    try:
        await events.prime(first_deadline)
    except BaseException:
        await events.aclose()
        raise
    return streamed(events, meter, response.headers)


class _Events:
    """The upstream's events, decoded, metered as they pass; ``aclose`` closes the upstream. Its own
    ``error`` event passes too (redacted); the stream ending after it fails with ``RelayedFailure``.
    ``may_be_empty``: an event stream with no event is one (else it fails as a dropped connection)."""

    def __init__(self, http: HTTPUpstream, response: Any, meter: Meter, deadline: float,
                 may_be_empty: bool = False) -> None:
        self._http, self._response, self._meter, self._deadline = http, response, meter, deadline
        self._may_be_empty = may_be_empty
        self._lines = SSELines(response, http.timeouts.idle)
        self._first: ResponsesEvent | None = None
        self._closed = False
        self._finished = False  # its last event (``FINAL_EVENTS``) came
        self._errored = False  # its own ``error`` event came (relayed as it came)

    async def prime(self, first_deadline: float) -> None:
        self._first = await self._read(first_deadline)
        if self._first is not None and self._errored:  # before any event relayed: a failure as an error answer is
            raise UpstreamError(f"the upstream failed: {self._first.data.get('message')}")
        if self._first is None:
            kind = self._response.headers.get("content-type", "").split(";")[0].strip()
            if kind != "text/event-stream":  # e.g. a whole JSON answer: the upstream does not stream
                raise UpstreamError(f"the upstream answered a stream request with "
                                    f"{kind or 'no content-type'}, not an event stream")
            if self._may_be_empty:
                self._finished = True  # nothing to relay, and nothing cut short
                return
            # as a dropped connection: nothing reached the client, so another deployment may serve it
            raise Unavailable("the upstream ended the stream without an event")

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> ResponsesEvent:
        try:
            event, self._first = (self._first, None) if self._first is not None else \
                (await self._read(self._deadline), None)
        except BaseException:
            await self.aclose()
            raise
        if event is None:
            await self.aclose()
            if self._errored and not self._finished:  # its own ``error`` event told the client
                raise RelayedFailure("the upstream failed mid-stream")
            if not self._finished:  # cut short: a failure, not an answer
                raise Unavailable("the upstream ended the stream before it finished")
            raise StopAsyncIteration
        return event

    async def _read(self, deadline: float) -> ResponsesEvent | None:
        data = await self._lines.next(deadline)
        if data is None:
            return None
        try:
            event = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            raise UpstreamError("the upstream sent an invalid event") from None
        if not isinstance(event, dict):
            raise UpstreamError("the upstream sent an invalid event")
        kind = event.get("type")
        meter = self._meter
        if kind in _GENERATED_DELTAS:
            if meter.first_token_at is None:
                meter.first_token_at = time.perf_counter()
            if not meter.exact:
                meter.completion_tokens += estimate_text(str(event.get("delta", "")))
        elif kind == "response.output_item.done" and (tool := _hosted_tool(event.get("item"))):
            meter.tool_calls[tool] = meter.tool_calls.get(tool, 0) + 1  # billed if the stream ends short
        elif kind in FINAL_EVENTS and isinstance(response := event.get("response"), dict):
            self._finished = True
            redact_failure(response)
            meter_usage(meter, response.get("usage"))
            meter.tool_calls = hosted_tool_calls(response)
            meter_tier(meter, response)
        elif kind == "response.created" and isinstance(response := event.get("response"), dict):
            meter_tier(meter, response)  # the tier asked for; the final event's says the one served
        elif kind == "error":  # relayed as it came; a final event may follow, or the end (``RelayedFailure``)
            self._errored, event = True, redact_error_event(event)
        elif kind is None and "error" in event:  # an {"error": ...} object (as a chat stream's): the failure it names
            raise_if_error(data)
        return ResponsesEvent(event)

    def interrupt(self) -> None:
        """Have a read that waits for the upstream give up now (from a callback): it raises
        ``Interrupted``, and so does every read after it."""
        self._response.set_exception(Interrupted())

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._lines.close()
            await self._http.close_stream(self._response)
