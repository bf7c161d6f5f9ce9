"""The in-process engine as a ``Backend``.

Each wire request becomes one engine request per prompt (``n`` continuations share the prompt's
blocks inside the engine). Token counts are exact: prompt tokens are the ids the engine was given
(the chat template's ids for chat), completion tokens are the tokens it generated. Closing a
stream, or cancelling a non-streamed call, aborts the engine requests, which frees their KV blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from msgspec import UNSET

from backends.base import (
    BackendStats,
    BadRequest,
    ChunkStream,
    ClosingChunks,
    Completed,
)
from backends.call import NO_CONTEXT, CallContext
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.local import completions, embeddings, tools, wire
from backends.local.run import EngineRun, collect, compile_grammar, response_id, usage_of
from backends.local.tool_parsers import choose_parser
from backends.local.tools import ToolPlan
from backends.openai_wire import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionRequest,
    FinishReason,
    TextCompletion,
    ToolCallDelta,
)
from engine import AsyncEngine, InvalidRequest, MetricsSnapshot, PoolingParams, SamplingParams
from engine.block_manager import PrefixCacheSummary


class LocalEngineBackend:
    """One deployment served by an in-process ``AsyncEngine``."""

    provider = "local"

    def __init__(self, engine: AsyncEngine, upstream_model: str, deployment_id: str | None = None, *,
                 pooling: PoolingParams | None = None, tool_parser: str = "auto") -> None:
        if engine.tokenizer is None:
            raise ValueError(f"{upstream_model}: the local engine needs a model folder with a tokenizer")
        self.engine = engine
        self.upstream_model = upstream_model
        self.deployment_id = deployment_id or f"local:{upstream_model}"
        self.tokenizer = engine.tokenizer
        self.logprobs = wire.LogprobFormatter(self.tokenizer)
        self.pooling = pooling  # None: this deployment serves no embeddings
        self.tool_parser = choose_parser(tool_parser, self.tokenizer.tool_chat_template)
        self.metadata: dict[str, Any] = {"model_impl": engine.engine.model_impl, "max_model_len": engine.max_model_len}
        if pooling is not None:
            self.metadata["pooling"] = pooling.pooling

    # ------------------------------------------------------------ tokenizer (backends.base.Tokenizing)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def tokenize_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def tokenize_chat(self, request: ChatCompletionRequest, add_generation_prompt: bool = True,
                      add_special_tokens: bool = False) -> list[int]:
        plan = tools.plan(request, self.tool_parser)
        kwargs = plan.template_kwargs if plan is not None else {}
        variables = wire.template_variables(request)
        try:
            add, cont = wire.chat_prompt_options(request, add_generation_prompt)
            return self.tokenizer.apply_chat_template(wire.chat_messages(request), add_generation_prompt=add,
                                                      continue_final_message=cont,
                                                      add_special_tokens=add_special_tokens, **{**variables, **kwargs})
        except InvalidRequest as exc:  # no template, the template refused the conversation or a value in it
            # no param: a value the template could not use, one of the client's variables if it sent any
            param = exc.param or ("chat_template_kwargs" if variables else "messages")
            raise BadRequest(exc.message, param=param) from None

    def detokenize(self, ids: list[int]) -> str:
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest(f"token ids must be in [0, {vocab})", param="tokens")
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.piece(t) for t in ids]

    # ------------------------------------------------------------ chat

    async def _start_chat(self, request: ChatCompletionRequest,
                          ctx: CallContext) -> tuple[EngineRun, ToolPlan | None, str]:
        """The engine run, the tool plan (None: no tools) and the text each choice echoes first."""
        prompt, params, plan = await asyncio.to_thread(self._prepare_chat, request, ctx)
        run = EngineRun(self.engine, [prompt], params, "messages", ctx, limit_param=wire.limit_field(request))
        return run, plan, wire.chat_echo(request)

    def _prepare_chat(self, request: ChatCompletionRequest,
                      ctx: CallContext) -> tuple[list[int], SamplingParams, ToolPlan | None]:
        """The prompt's ids, the sampling parameters with the grammar compiled, and the tool plan:
        seconds of work for a long conversation or a big schema, so run off the event loop."""
        plan = tools.plan(request, self.tool_parser)
        prompt = ctx.prompt_ids(self, request)  # admission's count of it: the same ids
        if prompt is None:
            prompt = self.tokenize_chat(request)
        limit = ctx.output_limit(request.output_limit(), self.engine.max_model_len - len(prompt))
        grammar = plan.grammar() if plan is not None else None
        params = wire.sampling_params(request, limit, wire.chat_logprobs_count(request),
                                      wire.opt(request.prompt_logprobs, None), structured=grammar)
        try:
            compile_grammar(self.engine, params)
        except BadRequest as exc:
            if plan is not None and grammar is not None and exc.param == grammar.param:
                self._check_tool_schemas(plan)  # name the tool whose schema cannot be compiled
            raise
        return prompt, params, plan

    def _check_tool_schemas(self, plan: ToolPlan) -> None:
        """A BadRequest naming ``tools[i].function.parameters`` for the first tool schema the grammar
        engine cannot compile (the tool-call grammar is built from them)."""
        compiler = self.engine.engine.processor.structured()
        for schema in plan.schemas():
            try:
                compiler.compile(schema)
            except InvalidRequest as exc:
                raise BadRequest(exc.message, param=exc.param) from None

    async def chat(self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[ChatCompletion]:
        run, plan, echo = await self._start_chat(request, ctx)
        role = wire.answer_role(request)
        final = await collect(run)
        choices = []
        for o in final[0].outputs:
            message, finish = tools.message(plan, o.text, wire.finish_reason(o.finish_reason))
            message.role = role
            if echo:
                message.content = echo + (message.content or "")
            choices.append(ChatChoice(index=o.index, message=message, finish_reason=finish,
                                      logprobs=self.logprobs.chat(o.logprobs), stop_reason=o.stop_reason))
        k = wire.opt(request.prompt_logprobs, None)  # vLLM's: once, at the top level
        prompt_lp = UNSET if k is None else self.logprobs.prompt_entries(final[0].prompt_logprobs, k)
        response = ChatCompletion(id=response_id("chatcmpl"), model=request.model, choices=choices,
                                  usage=usage_of(run.meter), prompt_logprobs=prompt_lp)
        return Completed(response, run.meter)

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        run, plan, echo = await self._start_chat(request, ctx)
        role = wire.answer_role(request)
        chunk = wire.chunk_maker(ChatCompletionChunk, request, response_id("chatcmpl"), run.meter, usage_of)

        async def gen() -> AsyncIterator[ChatCompletionChunk]:
            # A named function's call: its id and name first, then its arguments; without echo the role
            # comes with them, at the first output (OpenAI's first chunk of a forced call).
            call_ids = [""] * run.n
            merged = plan is not None and plan.mode == "named" and not echo
            for i in range(0 if merged else run.n):
                yield chunk([ChatChunkChoice(index=i, delta=tools.opening_delta(plan, role, echo))])
            for i in range(run.n if echo else 0):  # vLLM's: the echoed text, after the role, before the answer
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=echo))])
            finished: set[int] = set()  # one finish chunk per choice, though later outputs still carry it
            buffered = [""] * run.n  # required: the text is held back until it is known to be a call
            held: list[list[Any]] = [[] for _ in range(run.n)]  # the logprobs of text held back
            auto = [plan.streaming() for _ in range(run.n)] if plan is not None and plan.mode == "auto" else []
            async for _, out in run.outputs():
                for o in out.outputs:
                    if o.index in finished:
                        continue
                    if o.finish_reason is not None:
                        finished.add(o.index)
                    logprobs = o.delta_logprobs if request.logprobs else None
                    if plan is not None and plan.mode == "named":  # the text is the arguments: stream them
                        if not call_ids[o.index]:
                            call_ids[o.index] = tools.call_id(plan.parser)
                            head = ToolCallDelta(index=0, id=call_ids[o.index], type="function",
                                                 function={"name": plan.named, "arguments": ""})
                            opening = ChatDelta(role=role, content=None, tool_calls=[head]) if merged else \
                                ChatDelta(tool_calls=[head])
                            yield chunk([ChatChunkChoice(index=o.index, delta=opening)])
                        buffered[o.index] += o.delta_text
                        if o.delta_text or logprobs:
                            part = ToolCallDelta(index=0, function={"arguments": o.delta_text})
                            delta = ChatDelta(tool_calls=[part]) if o.delta_text else ChatDelta()
                            yield chunk([ChatChunkChoice(index=o.index, delta=delta,
                                                         logprobs=self.logprobs.chat(logprobs))])
                        if o.finish_reason is not None:
                            ended: FinishReason = tools.forced_finish(plan, buffered[o.index],
                                                                      wire.finish_reason(o.finish_reason))
                            yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(), finish_reason=ended,
                                                         stop_reason=o.stop_reason)])
                        continue
                    if plan is not None:
                        held[o.index] += logprobs or []
                        if auto:  # content as it comes, held from where a call may start
                            content = auto[o.index].feed(o.delta_text)
                            if content:
                                lps = self.logprobs.chat(held[o.index]) if request.logprobs else None
                                yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(content=content),
                                                             logprobs=lps)])
                                held[o.index] = []
                        else:
                            buffered[o.index] += o.delta_text
                        if o.finish_reason is not None:
                            reason = wire.finish_reason(o.finish_reason)
                            closing = (tools.streamed_final_deltas(auto[o.index], o.index, reason) if auto
                                       else tools.final_deltas(plan, o.index, buffered[o.index], reason))
                            if request.logprobs:
                                closing[0].logprobs = self.logprobs.chat(held[o.index])
                            closing[-1].stop_reason = o.stop_reason
                            for c in closing:
                                yield chunk([c])
                        continue
                    if o.delta_text or logprobs:
                        yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(content=o.delta_text),
                                                     logprobs=self.logprobs.chat(o.delta_logprobs))])
                    if o.finish_reason is not None:
                        reason = wire.finish_reason(o.finish_reason)
                        yield chunk([ChatChunkChoice(index=o.index, delta=ChatDelta(), finish_reason=reason,
                                                     stop_reason=o.stop_reason)])
            if request.include_usage:
                yield chunk([], usage_of(run.meter))

        return ChunkStream(ClosingChunks(gen(), run.aclose, run.interrupt), run.meter)

    # ------------------------------------------------------------ completions

    async def complete(self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[TextCompletion]:
        return await completions.complete(self, request, ctx)

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]:
        return await completions.complete_stream(self, request, ctx)

    # ------------------------------------------------------------ embeddings

    async def embed(self, request: EmbeddingRequest, ctx: CallContext = NO_CONTEXT) -> Completed[EmbeddingList]:
        return await embeddings.embed(self, request, ctx)

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
