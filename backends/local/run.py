"""The engine requests behind one wire request: started together, metered, aborted together."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from backends.base import BadRequest, ContextTooLong, Interrupted, Meter, RequestFailed, Unavailable
from backends.call import CallContext
from backends.local.wire import LogprobFormatter
from backends.openai_wire import PromptTokensDetails, Usage
from engine import (
    AsyncEngine,
    EngineClosed,
    InvalidRequest,
    PoolingParams,
    RequestOutput,
    RequestRejected,
    RequestStream,
    SamplingParams,
)
from engine import RequestFailed as EngineRequestFailed


class LocalModel(Protocol):
    """What the endpoint modules (completions, embeddings) use of ``LocalEngineBackend``."""

    engine: AsyncEngine
    tokenizer: Any  # engine.tokenizer.Tokenizer
    logprobs: LogprobFormatter
    pooling: PoolingParams | None


def compile_grammar(engine: AsyncEngine, params: SamplingParams) -> None:
    """Compile the request's grammar into the engine's cache now, raising a BadRequest naming its
    field if it cannot be: called off the event loop (a grammar can take seconds to compile), so
    the engine's own check when the request is added is a cache hit."""
    if params.structured is None:
        return
    try:
        engine.engine.processor.structured().compile(params.structured)
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param=exc.param) from None


class EngineRun:
    """The engine requests behind one wire request, their meter, and their abort.

    The meter is the gateway's from the start (``CallContext.on_meter``), so a call cancelled
    before its answer is charged what the engine computed, its prompt tokens served from the prefix
    cache counted as such from the engine's first output on; a prompt the engine never started on
    (still queued when the client left) is not charged at all, and the tokens it generated that
    were not yet read (outputs still queued when the client left) are (``aclose``)."""

    def __init__(self, engine: AsyncEngine, prompts: list[list[int]], params: SamplingParams, param: str,
                 ctx: CallContext, *, count_output: bool = True, pooling: PoolingParams | None = None,
                 limit_param: str = "max_tokens", listed: bool = False) -> None:
        """``param`` is the wire field holding the prompt, ``limit_param`` the one holding the
        output limit (chat's ``max_completion_tokens`` when the client sent that): errors name them.
        ``listed``: the prompts are the items of a wire list, so an error names its item (``input[2]``)."""
        self.engine = engine
        self.n = params.n
        self.param = param
        self.limit_param = limit_param
        self.count_output = count_output  # False: what it generates is thrown away (scoring a prompt)
        self.prompt_lengths = [len(p) for p in prompts]
        self.meter = Meter(prompt_tokens=sum(self.prompt_lengths), exact=True)
        self._cached = [0] * len(prompts)  # per prompt: its cached tokens already on the meter
        self._generated = [0] * len(prompts)  # per prompt: its generated tokens already on the meter
        self.ids: list[str] = []
        self.streams: list[RequestStream] = []
        self._closed = False
        self._readers: list[asyncio.Task[None]] = []  # several prompts' (``_merged``)
        self.finished: set[str] = set()
        who = ctx.tenant
        tenant, weight = (who.tenant_id, who.weight) if who is not None else ("", 1.0)
        try:
            for prompt in prompts:
                rid = f"local-{uuid.uuid4().hex}"
                self.streams.append(engine.add_request(rid, prompt, params, tenant=tenant, weight=weight,
                                                       pooling=pooling))
                self.ids.append(rid)
        except InvalidRequest as exc:
            self.abort()
            message, field = self._prompt_error(exc, len(self.ids) if listed else None)  # the one refused
            kind = ContextTooLong if isinstance(exc, RequestRejected) else BadRequest
            raise kind(message, param=field) from None
        except EngineClosed as exc:
            self.abort()
            raise Unavailable(exc.message) from None
        if ctx.on_meter is not None:
            ctx.on_meter(self.meter)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(prompt index, output)`` for every engine output, as the engine makes them: several
        prompts' interleaved (as vLLM streams them), none left waiting in the engine's queue while
        another prompt is read. A request that fails mid-run is a ``BadRequest`` (its input: a
        grammar the grammar engine gave up on) or a ``RequestFailed`` (the engine failed on it
        alone); its batch mates are unaffected."""
        async for p, out in self._merged():
            if any(o.delta_token_ids for o in out.outputs) and self.meter.first_token_at is None:
                self.meter.first_token_at = time.perf_counter()
            self._count_generated(p, out)
            self._count_cached(p, out)
            if out.finished:
                self.finished.add(self.ids[p])
                self.meter.phases.extend(_phases(out))
            yield p, out

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every prompt's outputs in the order they come: one reader task per prompt when there are
        several (each output copies its sequence's tokens so far: unread, they pile up quadratically)."""
        if len(self.streams) == 1:
            async for out in self._guarded(self.ids[0], self.streams[0]):
                yield 0, out
            return
        merged: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()
        self._readers = [asyncio.create_task(self._read(p, merged)) for p in range(len(self.streams))]
        try:
            left = len(self._readers)
            while left:
                p, item = await merged.get()
                if isinstance(item, Exception):
                    raise item
                if item is None:
                    left -= 1
                else:
                    yield p, item
        finally:
            await self._stop_readers()

    async def _read(self, p: int, merged: asyncio.Queue[tuple[int, RequestOutput | Exception | None]]) -> None:
        """Move prompt ``p``'s outputs to ``merged``, then None (its end) or the error it failed with."""
        try:
            async for out in self._guarded(self.ids[p], self.streams[p]):
                merged.put_nowait((p, out))
        except Exception as exc:  # raised where the outputs are read
            merged.put_nowait((p, exc))
        else:
            merged.put_nowait((p, None))

    async def _stop_readers(self) -> None:
        """Stop the reader tasks, so that nothing else reads the streams (``aclose`` drains them)."""
        readers, self._readers = self._readers, []
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    def _count_generated(self, p: int, out: RequestOutput) -> None:
        """Put prompt ``p``'s generated tokens (``out`` holds them all so far) on the meter, once."""
        if self.count_output:
            self.meter.completion_tokens += out.num_generated_tokens - self._generated[p]
            self._generated[p] = out.num_generated_tokens

    def _count_cached(self, p: int, out: RequestOutput) -> None:
        """Put prompt ``p``'s cached tokens on the meter once the engine has scheduled it (its
        outputs carry the count from then on), so a call cut short is charged them as cached."""
        self.meter.cached_tokens += out.num_cached_tokens - self._cached[p]
        self._cached[p] = out.num_cached_tokens

    async def _guarded(self, rid: str, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        try:
            async for out in stream:
                yield out
        except InvalidRequest as exc:
            self.finished.add(rid)
            raise BadRequest(self._message(exc), param=self._field(exc.param)) from None
        except EngineRequestFailed as exc:
            self.finished.add(rid)
            raise RequestFailed(f"the local engine failed on this request: {exc.message}") from None

    def _field(self, engine_param: str | None) -> str:
        """The wire field an engine error names."""
        return self.limit_param if engine_param == "max_tokens" else _field(engine_param, self.param)

    def _prompt_error(self, exc: InvalidRequest, index: int | None) -> tuple[str, str]:
        """The message and field of an engine error on one prompt, named ``input[2]`` by its ``index``
        in the wire list (None: the prompt is not an item of a list)."""
        field, message = self._field(exc.param), self._message(exc)
        if index is not None and field == self.param:
            return f"{field}[{index}]: {message}", f"{field}[{index}]"
        return message, field

    def _message(self, exc: InvalidRequest) -> str:
        """The engine's message, the output limit in it called as the client called it (the engine
        spells a field as ``param`` does: ``EngineError``)."""
        if exc.param == "max_tokens" and self.limit_param != "max_tokens":
            return exc.message.replace("max_tokens", self.limit_param)
        return exc.message

    def interrupt(self) -> None:
        """Have the read of the outputs that waits give up now (from a callback): it raises
        ``Interrupted``. The engine requests run on until ``aclose`` aborts them."""
        for stream in self.streams:
            stream.interrupt(Interrupted())

    def abort(self) -> None:
        for rid in self.ids:
            if rid not in self.finished:
                self.engine.abort(rid)
        self.finished.update(self.ids)

    async def aclose(self) -> None:
        """Abort what has not finished and, once the aborts have applied, charge what the engine
        generated that nobody read (a later prompt's tokens, those of the step running when the
        client left), and take the prompts the engine never started on off the meter: it did no
        work for them."""
        self.abort()
        await self._stop_readers()
        if self._closed:
            return
        self._closed = True
        for p, (stream, length) in enumerate(zip(self.streams, self.prompt_lengths)):
            final = await stream.cancel()
            if final is None:
                continue
            self._count_generated(p, final)
            self._count_cached(p, final)
            if final.first_scheduled_time is None:
                self.meter.prompt_tokens -= length


def _phases(out: RequestOutput) -> list[tuple[str, float, float]]:
    """The engine's queue / prefill / decode times of a finished request, in unix time."""
    now = time.monotonic()
    shift = time.time() - now
    marks = [("engine.queue", out.arrival_time), ("engine.prefill", out.first_scheduled_time),
             ("engine.decode", out.first_token_time)]
    known = [(name, t) for name, t in marks if t]
    ends = [t for _, t in known[1:]] + [now]
    return [(name, start + shift, end + shift) for (name, start), end in zip(known, ends)]


async def collect(run: EngineRun) -> list[RequestOutput]:
    """The final output of every prompt; a cancelled caller aborts the engine requests."""
    finals: dict[int, RequestOutput] = {}
    try:
        async for p, out in run.outputs():
            finals[p] = out
    finally:
        await run.aclose()
    return [finals[p] for p in range(len(run.ids))]




def _field(engine_param: str | None, prompt_field: str) -> str:
    """The wire field an engine error names: the engine's prompt is the API's ``prompt_field``
    (``messages`` for chat, ``prompt`` for completions, ``input`` for embeddings)."""
    return prompt_field if engine_param in (None, "prompt") else engine_param


def response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_of(meter: Meter) -> Usage:
    return Usage(prompt_tokens=meter.prompt_tokens, completion_tokens=meter.completion_tokens,
                 total_tokens=meter.total_tokens, prompt_tokens_details=PromptTokensDetails(meter.cached_tokens))
