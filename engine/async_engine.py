"""Asyncio front of the engine for serving.

One background task drives ``LLMEngine.step`` in a dedicated worker thread, so the event loop
never blocks on the model. Requests and aborts that arrive while a step is running are applied
right after it; an abort with no step in flight frees the sequence's blocks immediately.
Leaving the output iterator early (client gone) aborts the request; ``RequestStream.cancel`` aborts
it and returns its final output, which tells whether the engine ever started on it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from engine.block_manager import PrefixCacheSummary
from engine.config import EngineConfig
from engine.errors import EngineClosed, InvalidRequest
from engine.input_processor import EngineRequest
from engine.llm_engine import LLMEngine
from engine.metrics import MetricsSnapshot
from engine.outputs import RequestOutput
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, *, engine: LLMEngine | None = None) -> None:
        if engine is None:
            if config is None:
                raise TypeError("give an EngineConfig or an LLMEngine")
            engine = LLMEngine(config)
        self.engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._adds: list[EngineRequest] = []  # validated, joining the engine after the running step
        self._aborts: list[str] = []
        self._wake = asyncio.Event()
        self._in_flight = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop serving the streams

    @property
    def tokenizer(self):  # -> engine.tokenizer.Tokenizer | None
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def hidden_size(self) -> int:
        """The width of the model's final hidden states (an embedding's dimensions)."""
        return int(getattr(self.engine.hf_config, "hidden_size", 0))

    def get_metrics(self) -> MetricsSnapshot:
        return self.engine.get_metrics()

    def prefix_cache_summary(self, max_roots: int = 64) -> PrefixCacheSummary:
        """The prefix cache's size and its newest cached prompts' first-block hashes (for routers)."""
        return self.engine.prefix_cache_summary(max_roots)

    @property
    def num_pending(self) -> int:
        """Sequences of requests added but not yet handed to the scheduler (they join it after the
        running step); ``get_metrics`` does not see them yet."""
        return sum(r.params.n for r in self._adds)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        tenant: str = "",
        weight: float = 1.0,
        pooling: PoolingParams | None = None,
    ) -> RequestStream:
        """Validate and queue a request (raising RequestRejected / InvalidRequest / EngineClosed now,
        not later); return its ``RequestStream``: its outputs, the last one with ``finished=True``.
        A request that fails mid-run (``RequestOutput.error``) raises that error from the iterator.
        ``tenant`` and ``weight`` feed fair scheduling and the per-tenant metrics; ``pooling`` makes it
        an embedding request (its final output carries ``embedding``)."""
        if self._closed:
            raise EngineClosed("the engine is shut down")
        if request_id in self._streams:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        request = self.engine.processor.process(request_id, prompt, params, priority, tenant, weight, pooling)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self._adds.append(request)
        self._ensure_running()
        self._wake.set()
        return RequestStream(self, request_id, queue)

    def abort(self, request_id: str) -> None:
        """Cancel a request; its blocks are freed now, or right after the running step. Its stream
        ends with a final output (``finish_reason`` "abort"), also when the engine had not taken it
        in yet."""
        if request_id not in self._streams:
            return
        if self._in_flight:
            self._aborts.append(request_id)
        else:
            self._add_pending()
            self._abort_now(request_id)

    def abort_stream(self, request_id: str, queue: asyncio.Queue[RequestOutput | BaseException]) -> None:
        """Abort ``request_id`` if ``queue`` is still its stream's (the id may be free, or taken by a
        new request, once the stream has ended)."""
        if self._streams.get(request_id) is queue:
            self.abort(request_id)

    def abort_stream_threadsafe(self, request_id: str, queue: asyncio.Queue[RequestOutput | BaseException]) -> None:
        """``abort_stream`` from any thread (a stream dropped unfinished): it runs on the loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.abort_stream, request_id, queue)

    def _abort_now(self, request_id: str) -> None:
        final = self.engine.abort_request(request_id)
        queue = self._streams.pop(request_id, None)
        if queue is not None and final is not None:
            queue.put_nowait(final)

    def _apply_pending(self) -> None:
        """Between steps: the requests added meanwhile join the engine, then the aborts apply (an
        abort of a request added meanwhile finds it in the engine and ends its stream)."""
        self._add_pending()
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            self._abort_now(request_id)

    def _add_pending(self) -> None:
        adds, self._adds = self._adds, []
        for request in adds:
            try:
                self.engine.add_processed(request)
            except Exception as exc:  # validated on entry; anything here is reported, not lost
                queue = self._streams.pop(request.request_id, None)
                if queue is not None:
                    queue.put_nowait(exc)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="engine-loop")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._apply_pending()
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                await self._wake.wait()
                continue
            self._in_flight = True
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as exc:
                self._fail_all(exc)
                continue
            finally:
                self._in_flight = False
            for output in outputs:  # before the aborts made during the step: a request that finished
                queue = self._streams.get(output.request_id)  # in it gets its last output
                if queue is None:
                    continue
                queue.put_nowait(output if output.error is None else output.error)  # failed: raised there
                if output.finished:
                    del self._streams[output.request_id]
            self._apply_pending()

    def _fail_all(self, exc: Exception) -> None:
        """A step raised: end every stream with the error and drop its requests."""
        for request_id, queue in list(self._streams.items()):
            self.engine.abort_request(request_id)
            queue.put_nowait(EngineClosed(f"engine step failed: {exc!r}"))
        self._streams.clear()
        self._adds.clear()  # their streams are ended: nobody would read them

    async def shutdown(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._add_pending()  # so that every stream still open ends with a final output
        for request_id in list(self._streams):
            self._abort_now(request_id)
        self._executor.shutdown(wait=True)


class RequestStream:
    """One request's outputs, an async iterator (the last output has ``finished=True``; leaving
    early aborts the request), ``cancel``, and ``interrupt`` (a read that waits gives up).

    The stream is its own iterator and holds no reference to itself (no generator whose frame
    holds it), so a consumer that stops iterating and drops the stream aborts the request at once,
    not when the cycle collector finds the pair; ``aclose`` and a cancelled ``__anext__`` abort it
    at once too."""

    def __init__(self, engine: AsyncEngine, request_id: str,
                 queue: asyncio.Queue[RequestOutput | BaseException]) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue = queue
        self._ended = False  # the final output (or the error) has been taken from the queue
        self._aborted = False  # an abort was sent (never twice: the id may be reused afterwards)
        self._final: RequestOutput | None = None
        self._interrupt: BaseException | None = None  # in the queue to wake a read (``interrupt``)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended or self._aborted:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # the consumer was cancelled while waiting: nobody reads on
            self._abort()
            raise
        return self._take(item)

    def _take(self, item: RequestOutput | BaseException) -> RequestOutput:
        if isinstance(item, BaseException):
            if item is not self._interrupt:  # the request failed (an interrupt: it runs on)
                self._ended = True
            raise item
        if item.finished:
            self._ended, self._final = True, item
        return item

    def interrupt(self, exc: BaseException) -> None:
        """Have the read that waits (else the next read) raise ``exc``, from a callback on the loop:
        its reader gave up waiting. The request runs on: ``aclose`` or ``cancel`` aborts it, and
        ``cancel`` still returns its final output."""
        if self._interrupt is None:  # the first one stands: one in the queue is no failure
            self._interrupt = exc
        self._queue.put_nowait(self._interrupt)

    def _abort(self) -> None:
        if not self._ended and not self._aborted:
            self._aborted = True
            self._engine.abort_stream(self.request_id, self._queue)

    async def aclose(self) -> None:
        """Stop reading: abort the request unless it has ended."""
        self._abort()

    def __del__(self) -> None:
        if not self._ended and not self._aborted:  # dropped unfinished: from any thread, so via the loop
            self._engine.abort_stream_threadsafe(self.request_id, self._queue)

    async def cancel(self) -> RequestOutput | None:
        """Abort the request if it has not ended and return its final output once the abort has
        applied (after the running step at most); its ``first_scheduled_time`` is None when the
        engine never started on it. None: the request failed. Not while another task iterates."""
        self._abort()
        while not self._ended:
            item = await self._queue.get()
            if item is self._interrupt:
                continue
            if isinstance(item, BaseException):
                self._ended = True
            elif item.finished:
                self._ended, self._final = True, item
        return self._final
