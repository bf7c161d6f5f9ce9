"""The in-process engine as a ``Backend``.

Each wire request becomes one engine request per prompt (``n`` continuations share the prompt's
blocks inside the engine). Token counts are exact: prompt tokens are the ids the engine was given
(the chat template's ids for chat), completion tokens are the tokens it generated. Closing a
stream, or cancelling a non-streamed call, aborts the engine requests, which frees their KV blocks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from backends.base import (
    BackendStats,
    BadRequest,
    ChunkStream,
    ClosingChunks,
    Completed,
    ContextTooLong,
    Meter,
    Unavailable,
)
from backends.call import NO_CONTEXT, CallContext
from backends.local import wire
from backends.openai_wire import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    PromptTokensDetails,
    TextCompletion,
    Usage,
)
from engine import (
    AsyncEngine,
    EngineClosed,
    InvalidRequest,
    MetricsSnapshot,
    RequestOutput,
    RequestRejected,
    SamplingParams,
)
from engine.block_manager import PrefixCacheSummary


class _Run:
    """The engine requests behind one wire request, their meter, and their abort."""

    def __init__(self, engine: AsyncEngine, prompts: list[list[int]], params: SamplingParams, param: str,
                 ctx: CallContext) -> None:
        self.engine = engine
        self.n = params.n
        self.meter = Meter(prompt_tokens=sum(len(p) for p in prompts), exact=True)
        self.ids: list[str] = []
        self.streams: list[AsyncIterator[RequestOutput]] = []
        self.finished: set[str] = set()
        who = ctx.tenant
        tenant, weight = (who.tenant_id, who.weight) if who is not None else ("", 1.0)
        try:
            for prompt in prompts:
                rid = f"local-{uuid.uuid4().hex}"
                self.streams.append(engine.add_request(rid, prompt, params, tenant=tenant, weight=weight))
                self.ids.append(rid)
        except RequestRejected as exc:
            self.abort()
            raise ContextTooLong(exc.message, param=exc.param or param) from None
        except InvalidRequest as exc:
            self.abort()
            raise BadRequest(exc.message, param=exc.param or param) from None
        except EngineClosed as exc:
            self.abort()
            raise Unavailable(exc.message) from None

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(prompt index, output)`` for every engine output, prompt by prompt."""
        for p, (rid, stream) in enumerate(zip(self.ids, self.streams)):
            async for out in stream:
                for o in out.outputs:
                    if o.delta_token_ids:
                        self.meter.completion_tokens += len(o.delta_token_ids)
                        if self.meter.first_token_at is None:
                            self.meter.first_token_at = time.perf_counter()
                if out.finished:
                    self.finished.add(rid)
                    self.meter.cached_tokens += out.num_cached_tokens
                    self.meter.phases.extend(_phases(out))
                yield p, out

    def abort(self) -> None:
        for rid in self.ids:
            if rid not in self.finished:
                self.engine.abort(rid)
        self.finished.update(self.ids)

    async def aclose(self) -> None:
        self.abort()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _usage(meter: Meter) -> Usage:
    return Usage(prompt_tokens=meter.prompt_tokens, completion_tokens=meter.completion_tokens,
                 total_tokens=meter.total_tokens, prompt_tokens_details=PromptTokensDetails(meter.cached_tokens))


class LocalEngineBackend:
    """One deployment served by an in-process ``AsyncEngine``."""

    provider = "local"

    def __init__(self, engine: AsyncEngine, upstream_model: str, deployment_id: str | None = None) -> None:
        if engine.tokenizer is None:
            raise ValueError(f"{upstream_model}: the local engine needs a model folder with a tokenizer")
        self.engine = engine
        self.upstream_model = upstream_model
        self.deployment_id = deployment_id or f"local:{upstream_model}"
        self.tokenizer = engine.tokenizer
        self.logprobs = wire.LogprobFormatter(self.tokenizer)
        self.metadata = {"model_impl": engine.engine.model_impl}  # native | transformers (engine.model_impl)

    # ------------------------------------------------------------ chat

    def _start_chat(self, request: ChatCompletionRequest, ctx: CallContext) -> _Run:
        messages = wire.chat_messages(request)
        try:
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except InvalidRequest as exc:  # no template, or the template refused the conversation
            raise BadRequest(exc.message, param=exc.param) from None
        limit = ctx.output_limit(request.output_limit(), self.engine.max_model_len - len(prompt))
        params = wire.sampling_params(request, limit, wire.chat_logprobs_count(request))
        return _Run(self.engine, [prompt], params, "messages", ctx)

    async def chat(self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[ChatCompletion]:
        run = self._start_chat(request, ctx)
        final = await _collect(run)
        choices = [
            ChatChoice(index=o.index, message=AssistantMessage(content=o.text),
                       finish_reason=wire.finish_reason(o.finish_reason), logprobs=self.logprobs.chat(o.logprobs))
            for o in final[0].outputs
        ]
        response = ChatCompletion(id=_id("chatcmpl"), model=request.model, choices=choices, usage=_usage(run.meter))
        return Completed(response, run.meter)

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        run = self._start_chat(request, ctx)
        cid, created = _id("chatcmpl"), int(time.time())

        def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=cid, model=request.model, choices=choices, created=created,
                                       **({"usage": usage} if usage is not None else {}))

        async def gen() -> AsyncIterator[ChatCompletionChunk]:
            for i in range(run.n):
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
            async for _, out in run.outputs():
                for o in out.outputs:
                    if o.delta_text or (o.delta_logprobs and request.logprobs):
                        yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(content=o.delta_text),
                                                     logprobs=self.logprobs.chat(o.delta_logprobs))])
                    if o.finish_reason is not None:
                        reason = wire.finish_reason(o.finish_reason)
                        yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(), finish_reason=reason)])
            if request.include_usage:
                yield chunk([], _usage(run.meter))

        return ChunkStream(ClosingChunks(gen(), run.aclose), run.meter)  # type: ignore[arg-type]

    # ------------------------------------------------------------ completions

    def _start_completion(self, request: CompletionRequest, ctx: CallContext) -> tuple[_Run, list[list[int]]]:
        prompts = wire.completion_prompts(request)
        count = wire.opt(request.logprobs, None)
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        if not all(ids):
            raise BadRequest("the prompt is empty", param="prompt")
        params = wire.sampling_params(request, request.output_limit(), count)
        return _Run(self.engine, ids, params, "prompt", ctx), ids

    def _echo(self, request: CompletionRequest, prompt: list[int]) -> str:
        return self.tokenizer.decode(prompt) if request.echo else ""

    async def complete(self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[TextCompletion]:
        run, prompts = self._start_completion(request, ctx)
        finals = await _collect(run)
        choices = []
        for p, final in enumerate(finals):
            echo = self._echo(request, prompts[p])
            for o in final.outputs:
                choices.append(CompletionChoice(index=p * run.n + o.index, text=echo + o.text,
                                                finish_reason=wire.finish_reason(o.finish_reason),
                                                logprobs=self.logprobs.completion(o.logprobs, len(echo))))
        response = TextCompletion(id=_id("cmpl"), model=request.model, choices=choices, usage=_usage(run.meter))
        return Completed(response, run.meter)

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]:
        run, prompts = self._start_completion(request, ctx)
        cid, created = _id("cmpl"), int(time.time())

        def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> TextCompletion:
            return TextCompletion(id=cid, model=request.model, choices=choices, created=created,
                                  **({"usage": usage} if usage is not None else {}))

        async def gen() -> AsyncIterator[TextCompletion]:
            offsets: dict[int, int] = {}
            for p, prompt in enumerate(prompts):
                if echo := self._echo(request, prompt):
                    for i in range(run.n):
                        offsets[p * run.n + i] = len(echo)
                        yield chunk([CompletionChoice(index=p * run.n + i, text=echo)])
            async for p, out in run.outputs():
                for o in out.outputs:
                    index = p * run.n + o.index
                    if o.delta_text or o.delta_logprobs:
                        lp = self.logprobs.completion(o.delta_logprobs, offsets.get(index, 0))
                        offsets[index] = offsets.get(index, 0) + len(o.delta_text)
                        yield chunk([CompletionChoice(index=index, text=o.delta_text, logprobs=lp)])
                    if o.finish_reason is not None:
                        yield chunk([CompletionChoice(index=index, text="",
                                                      finish_reason=wire.finish_reason(o.finish_reason))])
            if request.include_usage:
                yield chunk([], _usage(run.meter))

        return ChunkStream(ClosingChunks(gen(), run.aclose), run.meter)  # type: ignore[arg-type]

    # ------------------------------------------------------------ the rest of the protocol

    def stats(self) -> BackendStats:
        m = self.engine.get_metrics()
        queued = m.num_waiting + self.engine.num_pending  # added during a step: queued, not yet scheduled
        return BackendStats(in_flight=m.num_running + queued, queue_depth=queued, kv_cache_usage=m.kv_usage)

    def engine_metrics(self) -> MetricsSnapshot:
        """The engine's ``MetricsSnapshot`` (running, waiting, KV usage, prefix hits, latencies)."""
        return self.engine.get_metrics()

    def prefix_cache_summary(self, max_roots: int = 64) -> PrefixCacheSummary:
        return self.engine.prefix_cache_summary(max_roots)

    async def ready(self) -> bool:
        return True  # the model is loaded when the backend exists

    async def aclose(self) -> None:
        await self.engine.shutdown()


def _phases(out: RequestOutput) -> list[tuple[str, float, float]]:
    """The engine's queue / prefill / decode times of a finished request, in unix time."""
    now = time.monotonic()
    shift = time.time() - now
    marks = [("engine.queue", out.arrival_time), ("engine.prefill", out.first_scheduled_time),
             ("engine.decode", out.first_token_time)]
    known = [(name, t) for name, t in marks if t]
    ends = [t for _, t in known[1:]] + [now]
    return [(name, start + shift, end + shift) for (name, start), end in zip(known, ends)]


async def _collect(run: _Run) -> list[RequestOutput]:
    """The final output of every prompt; a cancelled caller aborts the engine requests."""
    finals: dict[int, RequestOutput] = {}
    try:
        async for p, out in run.outputs():
            finals[p] = out
    finally:
        run.abort()
    return [finals[p] for p in range(len(run.ids))]


