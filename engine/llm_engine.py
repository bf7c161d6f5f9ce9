"""The synchronous engine (add requests, step) and the offline ``LLM`` front over it."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence as Seq
from pathlib import Path

import torch
from torch import nn

from engine.block_manager import BlockManager, PrefixCacheSummary
from engine.capacity.kv import Capacity, KVLayout
from engine.config import EngineConfig
from engine.errors import EngineError, InvalidRequest, RequestFailed
from engine.fair_queue import FairQueue
from engine.input_processor import EngineRequest, InputProcessor, RequestLimits
from engine.metrics import EngineMetrics, MetricsSnapshot
from engine.model_runner import ModelRunner
from engine.outputs import RequestOutput, RequestState, TextState
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams
from engine.scheduler import FCFSQueue, PriorityQueue, QueuePolicy, Scheduler
from engine.sequence import FinishReason, Sequence, TokenLogprob
from engine.structured_output import words_for


def _load_tokenizer(model_path: str):  # -> engine.tokenizer.Tokenizer | None
    from engine import gguf_file

    folder = gguf_file.tokenizer_folder(model_path) if gguf_file.is_gguf(model_path) else Path(model_path)
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from engine.tokenizer import Tokenizer

    return Tokenizer(folder)


def _config_eos_ids(hf_config: object, model_path: str) -> set[int]:
    ids: set[int] = set()
    sources = [getattr(hf_config, "eos_token_id", None)]
    gen = Path(model_path) / "generation_config.json"
    if gen.exists():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


class LLMEngine:
    """Owns model, cache, scheduler; ``step()`` runs one batch and returns changed requests."""

    def __init__(self, config: EngineConfig, model: nn.Module | None = None, hf_config: object = None) -> None:
        """Load the native model named by ``config.model``, or run a given ``model`` (any module
        with the native models' forward / compute_logits interface) with its ``hf_config``."""
        from engine.loader import model_kv_shape
        from engine.model_impl import load_engine_model

        self.config = config
        self.model_impl = "native"  # or "transformers" (engine.model_impl resolves config.model_impl)
        self.tokenizer = _load_tokenizer(config.model)  # first: building one from a GGUF file peaks in memory
        if model is None:
            loaded = load_engine_model(config.model, config.torch_dtype, config.device, config.attn_backend,
                                       config.model_impl)
            model, hf_config, self.model_impl = loaded.model, loaded.hf_config, loaded.resolution.impl
        elif hf_config is None:
            raise ValueError("a pre-built model needs its hf_config")
        self.hf_config = hf_config
        self.eos_token_ids = _config_eos_ids(hf_config, config.model)
        if self.tokenizer is not None:
            self.eos_token_ids |= set(self.tokenizer.eos_token_ids)
        max_len = config.resolve_max_model_len(int(getattr(hf_config, "max_position_embeddings", 2048)))
        num_layers, num_kv_heads, head_dim = getattr(model, "kv_shape", None) or model_kv_shape(hf_config)
        layout = KVLayout(num_layers, num_kv_heads, head_dim, dtype=config.torch_dtype)
        self.runner = ModelRunner(model, layout, config, self.eos_token_ids)
        self.capacity = Capacity(layout, self.runner.determine_num_blocks(), config.block_size)
        self.capacity.check_fits(max_len)
        self.runner.allocate_kv_cache(self.capacity.num_blocks)
        self.block_manager = BlockManager(
            self.capacity.num_blocks, config.block_size, config.enable_prefix_caching
        )
        policies: dict[str, type[QueuePolicy]] = {"priority": PriorityQueue, "fair": FairQueue, "fcfs": FCFSQueue}
        policy = policies[config.scheduling_policy]()
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            max_len,
            config.enable_chunked_prefill,
            policy,
        )
        vocab = int(getattr(hf_config, "vocab_size", 0)) or None
        limits = RequestLimits(max_len, self.capacity.num_blocks, config.block_size, vocab)
        # the one place requests are validated
        self.processor = InputProcessor(limits, self.tokenizer, self.eos_token_ids)
        self.runner.bitmask_words = words_for(max(vocab or 0, self.tokenizer.vocab_size if self.tokenizer else 0))
        self.metrics = EngineMetrics()
        self._requests: dict[str, RequestState] = {}

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    # -- requests ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        stream: bool = True,
        tenant: str = "",
        weight: float = 1.0,
        pooling: PoolingParams | None = None,
    ) -> None:
        """Validate and queue a request; raise RequestRejected if it can never fit, InvalidRequest
        if malformed. With ``stream=False`` the request is reported once, when it finishes.
        ``tenant`` and its ``weight`` matter to ``scheduling_policy="fair"`` and to the per-tenant
        metrics; ``pooling`` makes it an embedding request."""
        request = self.processor.process(request_id, prompt, params, priority, tenant, weight, pooling)
        self.add_processed(request, stream)

    def add_processed(self, request: EngineRequest, stream: bool = True) -> None:
        """Queue a request the input processor validated (``self.processor.process``)."""
        if request.request_id in self._requests:
            raise InvalidRequest(f"request id {request.request_id!r} is already in use")
        params, prompt_ids = request.params, request.prompt_ids
        now = time.monotonic()
        salt = 0 if self.config.enable_prefix_caching else (hash(request.request_id) | 1)
        seqs = []
        for i in range(params.n):
            seq = Sequence(request.request_id, prompt_ids, params, index=i, priority=request.priority,
                           arrival_time=now, max_len=request.max_len)
            seq.cache_salt = salt
            seq.tenant, seq.weight = request.tenant, request.weight
            if params.prompt_logprobs is not None and i == 0:  # one sequence scores the shared prompt
                seq.prompt_logprobs = [None]
            seq.pooling = request.pooling
            if params.structured is not None:
                seq.matcher = self.processor.structured().matcher(params.structured)
            if params.seed is not None:
                seq.generator = torch.Generator(device=self.runner.device)
                seq.generator.manual_seed((params.seed + i * 0x9E3779B1) % 2**63)
            seqs.append(seq)
        texts = [TextState(self.tokenizer, params, prompt_ids) for _ in seqs]
        self._requests[request.request_id] = RequestState(
            request.request_id, request.prompt_text, prompt_ids, seqs, texts, now, [0] * len(seqs), stream
        )
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Cancel a request and free its KV blocks now; return its final output."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ABORT)
        return req.output()

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # -- stepping ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        for item in out.scheduled:
            self.metrics.record_scheduled(item.seq.tenant, item.seq.weight, item.num_new_tokens)
        result = self.runner.execute(out.scheduled)
        for item in out.scheduled:
            if (new := result.prompt_logprobs.get(item.seq.seq_id)) is not None:
                item.seq.prompt_logprobs.extend(new)  # type: ignore[union-attr]  # set when computing them
        self.scheduler.update_after_step(out)
        touched: dict[str, RequestState] = {}
        for item in out.scheduled:  # embedding requests end with their prompt
            if (embedding := result.embeddings.get(item.seq.seq_id)) is not None:
                item.seq.embedding = embedding
                self.scheduler.finish(item.seq, FinishReason.STOP)
                touched[item.seq.request_id] = self._requests[item.seq.request_id]
        sample = result.output
        for j, item in enumerate(result.sampled):
            assert sample is not None
            seq = item.seq
            req = self._requests[seq.request_id]
            touched[req.request_id] = req
            if (exc := result.failed.get(seq.seq_id)) is not None:
                self._fail(req, RequestFailed(f"sampling this request failed: {exc!r}"))
            if seq.is_finished:  # its request failed (this step, by another of its sequences)
                continue
            if seq.params.max_tokens == 0:  # scoring: the prompt alone (its logprobs), no token
                self.metrics.prompt_tokens += seq.num_prompt_tokens
                req.texts[seq.index].finish()
                self.scheduler.finish(seq, FinishReason.LENGTH)
                continue
            logprob = None
            if seq.params.logprobs is not None and sample.logprobs is not None:
                assert sample.top_ids is not None and sample.top_logprobs is not None
                top = dict(zip(sample.top_ids[j], sample.top_logprobs[j]))
                logprob = TokenLogprob(sample.token_ids[j], sample.logprobs[j], top)
            self._append(seq, sample.token_ids[j], logprob)
        self._record_step()
        outputs = [req.output() for req in touched.values() if req.stream or req.finished]
        for req in touched.values():
            if req.finished:
                del self._requests[req.request_id]
                self.metrics.e2e_latency.observe(time.monotonic() - req.arrival_time)
        return outputs

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        previous = seq.last_token_time
        seq.append_token(token, logprob)
        if seq.matcher is not None:
            seq.matcher.consume_token(token)
            if seq.matcher.is_error():  # it accepts nothing more; is_stopped() would read "complete"
                self._fail(self._requests[seq.request_id], self._grammar_error(seq))
                return
        m = self.metrics
        m.generation_tokens += 1
        if previous is None:
            m.prompt_tokens += seq.num_prompt_tokens
            m.ttft.observe(seq.last_token_time - seq.arrival_time)  # type: ignore[operator]
        else:
            m.itl.observe(seq.last_token_time - previous)  # type: ignore[operator]
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self.scheduler.finish(seq, reason)

    def _fail(self, req: RequestState, error: EngineError) -> None:
        """End a request that broke down mid-run: its sequences finish with "error", their blocks
        are freed, and its output carries ``error``."""
        if req.error is None:
            req.error = error
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ERROR)

    @staticmethod
    def _grammar_error(seq: Sequence) -> InvalidRequest:
        """The grammar engine gave up on a constrained sequence (e.g. a parser row limit): a
        400 naming the constraint's field, never an answer that claims to be complete."""
        assert seq.matcher is not None and seq.params.structured is not None
        param = seq.params.structured.param
        reason = (seq.matcher.get_error().strip().splitlines() or ["no reason given"])[0]  # then its state dump
        return InvalidRequest(f"{param}: the grammar engine failed while generating ({reason}); "
                              "simplify the constraint", param=param)

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        """As vLLM: nothing but the length limit or a finished grammar stops a sequence before
        ``min_tokens`` outputs (no stop token id, EOS or stop string)."""
        p = seq.params
        text = self._requests[seq.request_id].texts[seq.index]
        may_stop = seq.num_output_tokens >= p.min_tokens
        if may_stop:
            if not p.ignore_eos and token in self.eos_token_ids:  # first, as vLLM: no stop_reason
                text.stop(None, token)
                return FinishReason.STOP
            if token in p.stop_token_ids:
                text.stop(token, token)
                return FinishReason.STOP
        if text.push(token, check_stop=may_stop):
            return FinishReason.STOP
        if seq.matcher is not None and seq.matcher.is_stopped():
            # The grammar admits nothing more (EOS at most): it ends here, also while EOS is
            # banned (min_tokens, logit_bias -100) or ignored, never with a token outside it.
            text.stop(None)
            return FinishReason.STOP
        if seq.num_tokens >= seq.max_len:
            text.finish()
            return FinishReason.LENGTH
        return None

    def _record_step(self) -> None:
        held = sum(s.num_computed_tokens for s in self.scheduler.running)
        slots = sum(len(s.block_table) for s in self.scheduler.running) * self.config.block_size
        self.metrics.record_step(held, slots)

    def prefix_cache_summary(self, max_roots: int = 64) -> PrefixCacheSummary:
        return self.block_manager.cache_summary(max_roots)

    def get_metrics(self) -> MetricsSnapshot:
        s, b = self.scheduler, self.block_manager
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        for seq in s.waiting:
            waiting[seq.tenant] = waiting.get(seq.tenant, 0) + 1
        for seq in s.running:
            running[seq.tenant] = running.get(seq.tenant, 0) + 1
        return self.metrics.snapshot(
            len(s.running), len(s.waiting), b.usage, b.prefix_queries, b.prefix_hits, s.num_preemptions,
            self.metrics.tenant_figures(waiting, running),
        )


PromptInput = str | list[int]


def _prompt_list(prompts: PromptInput | Seq[PromptInput]) -> list[PromptInput]:
    """One prompt (a string or a list of token ids) or several, as a list of prompts."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and all(isinstance(t, int) for t in prompts) and prompts):
        return [prompts]
    return list(prompts)  # type: ignore[arg-type]  # several prompts


class LLM:
    """Offline batch generation: ``LLM(path, **engine_args).generate(prompts, params)``."""

    def __init__(self, model: str, **engine_args: object) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))  # type: ignore[arg-type]
        self._counter = 0

    @property
    def tokenizer(self):  # -> engine.tokenizer.Tokenizer | None
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Seq[PromptInput],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Seq[int] | None = None,
    ) -> list[RequestOutput]:
        """One finished output per prompt, in order. A request that failed mid-run (its grammar
        broke down) comes back with ``error`` set and its sequences finished with "error"."""
        prompt_list = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError("give one SamplingParams, or one per prompt")
        priorities = list(priority) if priority else [0] * len(prompt_list)
        return self._run(list(zip(prompt_list, params_list, priorities)), None, use_tqdm)

    def embed(self, prompts: PromptInput | Seq[PromptInput], pooling: PoolingParams | None = None) -> list[list[float]]:
        """One embedding per prompt: the final hidden states pooled (``engine.pooling``)."""
        requests = [(p, SamplingParams(max_tokens=None), 0) for p in _prompt_list(prompts)]
        return [out.embedding or [] for out in self._run(requests, pooling or PoolingParams(), False)]

    def _run(self, requests: list[tuple[PromptInput, SamplingParams, int]], pooling: PoolingParams | None,
             use_tqdm: bool) -> list[RequestOutput]:
        ids: list[str] = []
        try:
            for prompt, params, priority in requests:
                self._counter += 1
                self.engine.add_request(f"offline-{self._counter}", prompt, params, priority, stream=False,
                                        pooling=pooling)
                ids.append(f"offline-{self._counter}")
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req")
        done: dict[str, RequestOutput] = {}
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        done[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
        except BaseException:  # a failed step or Ctrl-C: free the KV blocks, leave nothing to run later
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [done[i] for i in ids]
