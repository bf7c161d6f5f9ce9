"""Legacy text completions on the in-process engine, including what evaluation harnesses send.

``echo`` returns the prompt before the continuation; with ``logprobs`` it also returns the prompt
tokens' logprobs (the first is null, as OpenAI and vLLM answer), computed by the engine in the same
prefill (``SamplingParams.prompt_logprobs``). ``max_tokens: 0`` scores the prompt without
generating (the engine's ``max_tokens=0``: a prompt as long as the context fits).
lm-evaluation-harness's ``local-completions`` loglikelihood requests are ``echo: true, logprobs: 1``
with ``max_tokens`` 0 or 1. vLLM's ``prompt_logprobs: k`` puts the same values, in vLLM's shape
(``backends.logprobs_wire``), on each choice; they are not streamed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from msgspec import UNSET, UnsetType

from backends.base import BadRequest, ChunkStream, ClosingChunks, Completed
from backends.call import CallContext
from backends.local import wire
from backends.local.run import EngineRun, LocalModel, collect, compile_grammar, response_id, usage_of
from backends.local.wire import TextOffsets
from backends.logprobs_wire import PromptLogprobs
from backends.openai_wire import CompletionChoice, CompletionLogprobs, CompletionRequest, TextCompletion
from engine import RequestOutput


class _Completion:
    """One completion request: its prompts' ids, how it was asked, and its engine run (``start``)."""

    def __init__(self, backend: LocalModel, request: CompletionRequest, ctx: CallContext) -> None:
        """Tokenize and check the request and compile its grammar: seconds of work for a big
        request, so ``_start`` runs this off the event loop."""
        self.backend, self.request = backend, request
        self.sent = wire.completion_prompts(request)  # as the client sent them (echoed as such)
        tokenizer = backend.tokenizer
        self.prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in self.sent]
        if not all(self.prompts):
            raise BadRequest("the prompt is empty", param="prompt")
        self.count = wire.opt(request.logprobs, None)  # alternatives per token (None: no logprobs)
        self.echo = bool(request.echo)
        self.prompt_k: int | None = wire.opt(request.prompt_logprobs, None)  # vLLM's (None: not asked)
        # The gateway's cap (admission reserved that much per sequence) when the client set no limit.
        room = backend.engine.max_model_len - max(len(p) for p in self.prompts)
        limit = ctx.output_limit(request.output_limit(), room)
        self.score_only = limit == 0  # max_tokens 0: the prompt alone
        self.skip_special = bool(wire.opt(request.skip_special_tokens, True))  # as the text is decoded
        wanted = [k for k in (self.count if self.echo else None, self.prompt_k) if k is not None]
        prompt_logprobs = max(wanted) if wanted else None  # the echo and prompt_logprobs each take theirs
        self.params = wire.sampling_params(request, 0 if self.score_only else limit, self.count, prompt_logprobs,
                                           score_only=self.score_only)
        compile_grammar(backend.engine, self.params)

    def start(self, ctx: CallContext) -> None:
        """Add the engine requests (on the event loop)."""
        self.run = EngineRun(self.backend.engine, self.prompts, self.params, "prompt", ctx,
                             count_output=not self.score_only, listed=self.request.listed)

    @property
    def n(self) -> int:
        return self.run.n

    def echo_part(self, p: int, out: RequestOutput | None) -> tuple[str, CompletionLogprobs | None]:
        """The echoed prompt of prompt ``p`` and, when asked, its tokens' logprobs (from ``out``)."""
        if not self.echo:
            return "", None
        text, added = wire.echo_text(self.backend.tokenizer, self.sent[p], self.prompts[p])
        if self.count is None or out is None:
            return text, None
        return text, self.backend.logprobs.prompt(self.prompts[p], out.prompt_logprobs or [], self.count, added)

    def prompt_entries(self, out: RequestOutput) -> PromptLogprobs | UnsetType:
        """vLLM's ``prompt_logprobs`` of ``out``'s prompt, when the client asked for them."""
        if self.prompt_k is None:
            return UNSET
        return self.backend.logprobs.prompt_entries(out.prompt_logprobs, self.prompt_k)

    def generated(self, o: Any, offsets: TextOffsets, delta: bool) -> tuple[str, CompletionLogprobs | None]:
        """The continuation (all of it, or the new part) and its logprobs, their text offsets
        counted by ``offsets``."""
        if self.score_only:
            return "", CompletionLogprobs() if self.count is not None else None
        text, items = (o.delta_text, o.delta_logprobs) if delta else (o.text, o.logprobs)
        return text, self.backend.logprobs.completion(items, offsets)

    def offsets(self, p: int, start: int) -> TextOffsets:
        """A counter of the text offsets of a choice of prompt ``p``, its continuation starting at ``start``."""
        return TextOffsets(self.backend.logprobs, start, self.skip_special, self.prompts[p])

    def finish_reason(self, reason: str | None) -> Any:
        return "length" if self.score_only and reason is not None else wire.finish_reason(reason)


def _joined(first: CompletionLogprobs | None, second: CompletionLogprobs | None) -> CompletionLogprobs | None:
    if first is None or second is None:
        return first or second
    return CompletionLogprobs(tokens=first.tokens + second.tokens,
                              token_logprobs=first.token_logprobs + second.token_logprobs,
                              top_logprobs=first.top_logprobs + second.top_logprobs,
                              text_offset=first.text_offset + second.text_offset)


async def _start(backend: LocalModel, request: CompletionRequest, ctx: CallContext) -> _Completion:
    c = await asyncio.to_thread(_Completion, backend, request, ctx)
    c.start(ctx)
    return c


async def complete(
    backend: LocalModel, request: CompletionRequest, ctx: CallContext
) -> Completed[TextCompletion]:
    c = await _start(backend, request, ctx)
    finals = await collect(c.run)
    choices = []
    for p, final in enumerate(finals):
        echo, echo_lp = c.echo_part(p, final)
        prompt_lp = c.prompt_entries(final)
        for o in final.outputs:
            text, lp = c.generated(o, c.offsets(p, len(echo)), delta=False)
            choices.append(CompletionChoice(index=p * c.n + o.index, text=echo + text,
                                            finish_reason=c.finish_reason(o.finish_reason),
                                            logprobs=_joined(echo_lp, lp), stop_reason=o.stop_reason,
                                            prompt_logprobs=prompt_lp))
    response = TextCompletion(id=response_id("cmpl"), model=request.model, choices=choices, usage=usage_of(c.run.meter))
    return Completed(response, c.run.meter)


async def complete_stream(
    backend: LocalModel, request: CompletionRequest, ctx: CallContext
) -> ChunkStream[TextCompletion]:
    c = await _start(backend, request, ctx)
    chunk = wire.chunk_maker(TextCompletion, request, response_id("cmpl"), c.run.meter, usage_of)

    async def gen() -> AsyncIterator[TextCompletion]:
        offsets: dict[int, TextOffsets] = {}  # text offsets of the tokens, per choice
        pending_echo = set(range(len(c.prompts))) if c.echo else set()
        scored = c.count is not None  # the echo waits for the prompt's logprobs (its first output)
        if c.echo and not scored:
            for p in range(len(c.prompts)):
                text, _ = c.echo_part(p, None)
                for i in range(c.n):
                    offsets[p * c.n + i] = c.offsets(p, len(text))
                    yield chunk([CompletionChoice(index=p * c.n + i, text=text)])
            pending_echo.clear()
        finished: set[int] = set()  # one finish chunk per choice, though later outputs still carry it
        async for p, out in c.run.outputs():
            if p in pending_echo:
                pending_echo.discard(p)
                text, lp = c.echo_part(p, out)
                for i in range(c.n):
                    offsets[p * c.n + i] = c.offsets(p, len(text))
                    yield chunk([CompletionChoice(index=p * c.n + i, text=text, logprobs=lp)])
            for o in out.outputs:
                index = p * c.n + o.index
                if index in finished:
                    continue
                if index not in offsets:
                    offsets[index] = c.offsets(p, 0)
                text, lp = c.generated(o, offsets[index], delta=True)
                if text or (lp is not None and lp.tokens):
                    yield chunk([CompletionChoice(index=index, text=text, logprobs=lp)])
                if o.finish_reason is not None:
                    finished.add(index)
                    reason = c.finish_reason(o.finish_reason)
                    yield chunk([CompletionChoice(index=index, text="", finish_reason=reason,
                                                  stop_reason=o.stop_reason)])
        if request.include_usage:
            yield chunk([], usage_of(c.run.meter))

    return ChunkStream(ClosingChunks(gen(), c.run.aclose, c.run.interrupt), c.run.meter)
