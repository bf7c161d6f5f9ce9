"""The ``transformers`` provider: plain ``model.generate`` for models the engine cannot run.

Requests are validated and tokenised here (the chat template of the model's tokenizer), handed to
the ``GenerateWorker`` thread as a ``Job``, and its events are turned into OpenAI wire responses or
stream chunks. Token counts are exact (the model's own tokenizer, the tokens actually generated,
EOS included as the engine counts it). Closing a stream aborts the job and waits for the worker
to acknowledge, so the meter then holds the tokens really produced. Structured output and tools
work as on the engine's backend (``backends.local.structured`` / ``tools``), the grammar applied by
``grammar.GrammarLogits``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from jinja2.exceptions import TemplateError
from msgspec import UNSET

from backends.base import BackendStats, BadRequest, ChunkStream, ClosingChunks, Completed, ContextTooLong, Meter
from backends.call import NO_CONTEXT, CallContext
from backends.embeddings_wire import EmbeddingList, EmbeddingRequest
from backends.local import tools
from backends.local.structured import output_constraint
from backends.local.tool_parsers import choose_parser
from backends.local.wire import (
    LogprobFormatter,
    TextOffsets,
    answer_role,
    chat_echo,
    chat_messages,
    chat_prompt_options,
    chunk_maker,
    echo_text,
    limit_field,
)
from backends.openai_wire import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    SamplingFields,
    TextCompletion,
    Usage,
)
from backends.transformers_generate.grammar import Grammars
from backends.transformers_generate.jobs import Event
from backends.transformers_generate.params import generate_key, opt, row_params
from backends.transformers_generate.runs import JobRun, PendingLogprobs, collect, relay
from backends.transformers_generate.worker import GenerateWorker
from engine.structured_output import StructuredOutput, words_for


class HFGenerateBackend:
    """One deployment served by ``transformers`` ``generate`` in a worker thread."""

    provider = "transformers"

    def __init__(self, deployment_id: str, upstream_model: str, model: Any, tokenizer: Any, *,
                 eos_ids: set[int], max_model_len: int, vocab_size: int, max_batch_rows: int = 8, max_queue: int = 64,
                 metadata: dict[str, Any] | None = None) -> None:
        self.deployment_id = deployment_id
        self.upstream_model = upstream_model
        self.tokenizer = tokenizer
        self.logprobs = LogprobFormatter(tokenizer)
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size  # the model's embedding rows (token ids must be below it)
        self.metadata = dict(metadata or {})
        self._active: set[JobRun] = set()  # requests submitted and not yet finished
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0)
        grammar_vocab = max(vocab_size, len(tokenizer))
        self.grammars = Grammars(upstream_model, grammar_vocab, eos_ids)
        template = getattr(tokenizer, "chat_template", None)
        self.tool_parser = choose_parser("auto", template if isinstance(template, str) else None)
        self.worker = GenerateWorker(model, tokenizer, eos_ids, pad, max_batch_rows=max_batch_rows,
                                     max_queue=max_queue, bitmask_words=words_for(grammar_vocab),
                                     max_len=max_model_len)

    # ------------------------------------------------------------ Backend protocol

    async def chat(self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[ChatCompletion]:
        k = _chat_logprobs(request)
        role, echo = answer_role(request), chat_echo(request)
        run, plan = self._start_chat(request, k, ctx)
        texts, reasons, lps = await collect(run)
        choices = []
        for i, t in enumerate(texts):
            message, finish = tools.message(plan, t, _reason(reasons[i]))
            message.role = role
            if echo:  # vLLM's: the final message's text first, not generated (no logprobs, no tokens)
                message.content = echo + (message.content or "")
            choices.append(ChatChoice(index=i, message=message, finish_reason=finish,
                                      logprobs=self.logprobs.chat(lps[i]) if k is not None else None))
        response = ChatCompletion(id=_id("chatcmpl"), model=request.model, choices=choices, usage=_usage(run.meter))
        return Completed(response, run.meter)

    async def chat_stream(
        self, request: ChatCompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[ChatCompletionChunk]:
        k = _chat_logprobs(request)
        role, echo = answer_role(request), chat_echo(request)
        run, plan = self._start_chat(request, k, ctx)
        chunk = chunk_maker(ChatCompletionChunk, request, _id("chatcmpl"), run.meter, _usage)
        pending = PendingLogprobs()
        buffered = [""] * run.job.num_rows  # a forced call: the text is held back until it is known to be a call
        held: list[list[Any]] = [[] for _ in range(run.job.num_rows)]  # the logprobs of text held back
        # auto: content as it is generated, held only from where a call may start (as the engine streams it)
        auto = [plan.streaming() for _ in range(run.job.num_rows)] if plan is not None and plan.mode == "auto" else []

        def on_event(ev: Event) -> list[ChatCompletionChunk]:
            lps = pending.add(ev)
            if lps is None:
                return []
            if plan is not None:
                held[ev.index] += lps
                out: list[ChatCompletionChunk] = []
                if auto:
                    if content := auto[ev.index].feed(ev.text):
                        logprobs = self.logprobs.chat(held[ev.index]) if k is not None else None
                        out.append(chunk([ChatChunkChoice(index=ev.index, delta=ChatDelta(content=content),
                                                          logprobs=logprobs)]))
                        held[ev.index] = []
                else:
                    buffered[ev.index] += ev.text
                if ev.finish is None:
                    return out
                reason = _reason(ev.finish)
                closing = (tools.streamed_final_deltas(auto[ev.index], ev.index, reason) if auto
                           else tools.final_deltas(plan, ev.index, buffered[ev.index], reason))
                if k is not None:
                    closing[0].logprobs = self.logprobs.chat(held[ev.index])
                return out + [chunk([c]) for c in closing]
            logprobs = self.logprobs.chat(lps) if k is not None else None
            if ev.finish is not None:
                return [chunk([ChatChunkChoice(index=ev.index, delta=ChatDelta(), finish_reason=_reason(ev.finish),
                                               logprobs=logprobs)])]
            return [chunk([ChatChunkChoice(index=ev.index, delta=ChatDelta(content=ev.text), logprobs=logprobs)])]

        first = [chunk([ChatChunkChoice(index=i, delta=ChatDelta(role=role, content=""))])
                 for i in range(run.job.num_rows)]
        first += [chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=echo))])
                  for i in range(run.job.num_rows if echo else 0)]
        usage = (lambda: chunk([], _usage(run.meter))) if request.include_usage else None
        return ChunkStream(ClosingChunks(relay(run, first, on_event, usage), run.cancel, run.interrupt), run.meter)

    async def complete(self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT) -> Completed[TextCompletion]:
        prompts = self._text_prompts(request)
        k = _opt_int(request.logprobs)
        run = self._start(request, prompts, request.output_limit(), k, ctx)
        texts, reasons, lps = await collect(run)
        echoes = self._echoes(request, prompts)
        offsets = self._offsets(request, prompts, echoes)
        choices = [
            CompletionChoice(
                index=i,
                text=echoes[i] + t,
                finish_reason=_reason(reasons[i]),
                logprobs=self.logprobs.completion(lps[i], offsets[i]) if k is not None else None,
            )
            for i, t in enumerate(texts)
        ]
        response = TextCompletion(id=_id("cmpl"), model=request.model, choices=choices, usage=_usage(run.meter))
        return Completed(response, run.meter)

    async def complete_stream(
        self, request: CompletionRequest, ctx: CallContext = NO_CONTEXT
    ) -> ChunkStream[TextCompletion]:
        prompts = self._text_prompts(request)
        k = _opt_int(request.logprobs)
        run = self._start(request, prompts, request.output_limit(), k, ctx)
        chunk = chunk_maker(TextCompletion, request, _id("cmpl"), run.meter, _usage)
        pending = PendingLogprobs()
        echoes = self._echoes(request, prompts)
        offsets = self._offsets(request, prompts, echoes)

        def on_event(ev: Event) -> list[TextCompletion]:
            lps = pending.add(ev)
            if lps is None:
                return []
            logprobs = None
            if k is not None:
                logprobs = self.logprobs.completion(lps, offsets[ev.index])
            reason = _reason(ev.finish) if ev.finish is not None else None
            return [chunk([CompletionChoice(index=ev.index, text=ev.text, finish_reason=reason, logprobs=logprobs)])]

        first = [chunk([CompletionChoice(index=i, text=e)]) for i, e in enumerate(echoes) if e]
        usage = (lambda: chunk([], _usage(run.meter))) if request.include_usage else None
        return ChunkStream(ClosingChunks(relay(run, first, on_event, usage), run.cancel, run.interrupt), run.meter)

    async def embed(self, request: EmbeddingRequest, ctx: CallContext = NO_CONTEXT) -> Completed[EmbeddingList]:
        raise BadRequest(f"the model '{request.model}' is served by plain transformers generate, which gives no "
                         "embeddings", param="model")

    def stats(self) -> BackendStats:
        return BackendStats(in_flight=len(self._active), queue_depth=self.worker.queue_depth)

    async def ready(self) -> bool:
        return True  # the model is loaded when the backend exists

    async def aclose(self) -> None:
        await asyncio.to_thread(self.worker.close)

    # ------------------------------------------------------------ requests -> jobs

    def _start_chat(self, request: ChatCompletionRequest, k: int | None,
                    ctx: CallContext) -> tuple[JobRun, tools.ToolPlan | None]:
        """The job for a chat request: tools rendered through the chat template, and a named or
        required tool_choice enforced with its grammar (as the engine's backend does)."""
        plan = tools.plan(request, self.tool_parser)
        prompt = self._chat_prompt(request, plan)
        grammar = plan.grammar() if plan is not None else None
        return self._start(request, [prompt], request.output_limit(), k, ctx, grammar), plan

    def _chat_prompt(self, request: ChatCompletionRequest, plan: tools.ToolPlan | None) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("this model has no chat template; use /v1/completions", param="messages")
        kwargs = plan.template_kwargs if plan is not None else {}
        add, cont = chat_prompt_options(request)
        try:
            text = self.tokenizer.apply_chat_template(chat_messages(request), add_generation_prompt=add,
                                                      continue_final_message=cont, tokenize=False, **kwargs)
        except (ValueError, TemplateError) as exc:  # the final message's text is missing; the template refused
            raise BadRequest(f"chat template: {exc}", param="messages") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _text_prompts(self, request: CompletionRequest) -> list[list[int]]:
        if request.suffix:
            raise BadRequest("suffix is not supported by this model", param="suffix")
        if request.best_of not in (UNSET, None) and request.best_of != opt(request.n, 1):
            raise BadRequest("best_of other than n is not supported", param="best_of")
        if request.echo and _opt_int(request.logprobs) is not None:
            raise BadRequest("echo with logprobs (the prompt's logprobs) needs a model the engine runs "
                             "(provider: local); plain generate cannot score the prompt", param="echo")
        try:
            prompts = request.prompts()
        except ValueError as exc:
            raise BadRequest(str(exc), param="prompt") from None
        vocab = self.vocab_size
        out = []
        for p in prompts:
            ids = list(self.tokenizer.encode(p)) if isinstance(p, str) else p
            if any(not 0 <= t < vocab for t in ids):
                raise BadRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
            out.append(ids)
        return out

    def _echoes(self, request: CompletionRequest, prompts: list[list[int]]) -> list[str]:
        n = request.n or 1
        if not request.echo:
            return [""] * (len(prompts) * n)
        sent: Sequence[str | list[int]] = request.prompts()  # read once already (``_text_prompts``): valid
        return [echo_text(self.tokenizer, s, p)[0] for s, p in zip(sent, prompts, strict=True) for _ in range(n)]

    def _offsets(self, request: CompletionRequest, prompts: list[list[int]], echoes: list[str]) -> list[TextOffsets]:
        """Per choice, the counter of its tokens' text offsets (its continuation follows its echo)."""
        n = request.n or 1
        return [TextOffsets(self.logprobs, len(e), True, prompts[i // n]) for i, e in enumerate(echoes)]

    def _start(
        self,
        request: SamplingFields,
        prompts: list[list[int]],
        limit: int | None,
        logprobs: int | None,
        ctx: CallContext,
        structured: StructuredOutput | None = None,
    ) -> JobRun:
        """``structured`` (a forced tool call's grammar) is used instead of the request's own output
        constraint, which the request may then not give."""
        if not all(prompts):
            raise BadRequest("the prompt is empty", param="prompt")
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise ContextTooLong(
                f"the prompt has {longest} tokens; this model's context is {self.max_model_len} tokens",
                param="messages" if isinstance(request, ChatCompletionRequest) else "prompt",
            )
        room = self.max_model_len - longest
        if isinstance(request, ChatCompletionRequest):
            limit = ctx.output_limit(limit, room)
        field = limit_field(request)  # chat's max_completion_tokens when the client sent that
        if limit is not None and limit < 1:
            raise BadRequest(f"{field} must be at least 1", param=field)
        if limit is not None and limit > room:
            raise ContextTooLong(
                f"{longest} prompt tokens + {limit} output tokens ({field}) exceed this model's context of "
                f"{self.max_model_len} tokens",
                param=field,
            )
        params = row_params(request, limit if limit is not None else room, self.vocab_size, logprobs)
        n = request.n or 1
        so = output_constraint(request, structured)
        matchers = self.grammars.matchers(so, len(prompts) * n) if so is not None else None
        args = dict(prompts=prompts, n=n, key=generate_key(request), params=params, matchers=matchers)
        return JobRun(self.worker, args, sum(len(p) for p in prompts), self._active)


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _reason(finish: str) -> Any:
    return "length" if finish == "length" else "stop"


def _usage(meter: Meter) -> Usage:
    return Usage(
        prompt_tokens=meter.prompt_tokens, completion_tokens=meter.completion_tokens, total_tokens=meter.total_tokens
    )


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _chat_logprobs(request: ChatCompletionRequest) -> int | None:
    """How many alternatives per token the client wants (None: no logprobs)."""
    if not request.logprobs:
        if _opt_int(request.top_logprobs):
            raise BadRequest("top_logprobs requires logprobs: true", param="top_logprobs")
        return None
    return _opt_int(request.top_logprobs) or 0
