"""Runs one scheduled step: the flat batch, the model, logits for sampling rows, the sampler.

Also owns the KV cache tensors (one per layer, ``[2, num_blocks, block_size, num_kv_heads,
head_dim]``) and sizes them: on CUDA from ``gpu_memory_utilization`` minus weights and a measured
activation peak (a profile run at the largest batch); on CPU from ``num_kv_blocks`` /
``kv_cache_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.capacity.kv import KVLayout
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.layers.attention import ATTENTION_BACKENDS, PagedAttention
from engine.pooling import pool_step
from engine.prompt_logprobs import compute_prompt_logprobs
from engine.sampler import Sampler, SamplerOutput, SamplingRow, join_rows
from engine.scheduler import ScheduledSeq
from engine.sequence import TokenLogprob
from engine.step_inputs import StepInputBuilder
from engine.structured_output import PendingBitmask

DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass
class StepResult:
    sampled: list[ScheduledSeq]  # the scheduled sequences that sampled a token, in order
    output: SamplerOutput | None
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)  # new ones, by seq_id
    embeddings: dict[int, list[float]] = field(default_factory=dict)  # pooled this step, by seq_id
    failed: dict[int, Exception] = field(default_factory=dict)  # rows that could not be sampled, by seq_id


class ModelRunner:
    def __init__(self, model: nn.Module, layout: KVLayout, config: EngineConfig, eos_token_ids: set[int]) -> None:
        self.model: Any = model  # a native model or TransformersForCausalLM: forward, compute_logits
        self.layout = layout
        self.config = config
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.sampler = Sampler(self.device, config.seed)
        self.bitmask_words = 0  # 32-token words per bitmask row (set by the engine from the vocabulary)
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: DecodeGraphs | None = None
        max_blocks = -(-(config.max_model_len or 2048) // self.block_size)
        self.inputs = StepInputBuilder(self.device, config.max_num_seqs, max_blocks, self.block_size)

    # -- KV cache ----------------------------------------------------------------------------

    def _kv_tensors(self, num_blocks: int) -> list[torch.Tensor]:
        shape = (2, num_blocks, self.block_size, self.layout.num_kv_heads, self.layout.head_dim)
        return [
            torch.zeros(shape, dtype=self.layout.dtype, device=self.device)
            for _ in range(self.layout.num_layers)
        ]

    def determine_num_blocks(self) -> int:
        cfg = self.config
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        if self.device.type == "cuda" and cfg.kv_cache_bytes is None:
            return self._blocks_from_gpu_memory()
        budget = cfg.kv_cache_bytes if cfg.kv_cache_bytes is not None else DEFAULT_CPU_KV_BYTES
        return self.layout.blocks_in(budget, self.block_size)

    def _blocks_from_gpu_memory(self) -> int:
        """vLLM's rule: utilisation x total memory, minus everything but the KV cache at peak.

        The peak is the larger of a prefill at the largest batch and, for the torch attention
        backend (which gathers whole contexts), one layer's decode at the largest batch and length.
        """
        peak = self._measured_peak(self._profile_run)
        if self.config.attn_backend == "torch":
            try:
                peak = max(peak, self._measured_peak(self.decode_attention_probe))
            except torch.cuda.OutOfMemoryError:
                raise ValueError(
                    f"attn_backend='torch' cannot decode {self.config.max_num_seqs} sequences of "
                    f"{self.config.max_model_len} tokens on this GPU (it gathers every context); use "
                    "attn_backend='triton' or lower max_num_seqs / max_model_len") from None
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = (total - free) - torch.cuda.memory_reserved(self.device)
        available = int(total * self.config.gpu_memory_utilization) - peak - max(0, non_torch)
        torch.cuda.empty_cache()
        return self.layout.blocks_in(available, self.block_size)

    def _measured_peak(self, run: Callable[[], int]) -> int:
        """Peak device memory during ``run``, less the dummy KV cache bytes it returns."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        dummy_bytes = run()
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - dummy_bytes

    @torch.inference_mode()
    def decode_attention_probe(self) -> int:
        """One attention layer of a decode step at ``max_num_seqs`` sequences of ``max_model_len``
        tokens (all reading the same dummy blocks); return the dummy cache's bytes."""
        cfg = self.config
        assert cfg.max_model_len is not None
        layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        heads = layers[0].num_heads if layers else int(self.model.config.num_attention_heads)
        num_seqs, blocks = cfg.max_num_seqs, -(-cfg.max_model_len // self.block_size)
        cache = self._kv_tensors(blocks)[0]
        dev, i32 = self.device, torch.int32
        meta = AttentionMetadata(
            slot_mapping=torch.full((num_seqs,), -1, dtype=torch.long, device=dev),
            block_tables=torch.arange(blocks, dtype=i32, device=dev).expand(num_seqs, blocks),
            context_lens=torch.full((num_seqs,), cfg.max_model_len, dtype=i32, device=dev),
            query_start_loc=torch.arange(num_seqs + 1, dtype=i32, device=dev),
            max_query_len=1,
            max_context_len=cfg.max_model_len,
            block_size=self.block_size,
        )
        q = torch.zeros(num_seqs, heads, self.layout.head_dim, dtype=cache.dtype, device=dev)
        kv = torch.zeros(num_seqs, self.layout.num_kv_heads, self.layout.head_dim, dtype=cache.dtype, device=dev)
        ATTENTION_BACKENDS[cfg.attn_backend](q, kv, kv, cache, meta, 1.0, None)
        return cache.numel() * cache.element_size()

    @torch.inference_mode()
    def _profile_run(self) -> int:
        """One forward at the largest batch the scheduler can build; return the dummy cache size."""
        cfg = self.config
        assert cfg.max_model_len is not None
        seq_len = min(cfg.max_model_len, cfg.max_num_batched_tokens)
        num_seqs = max(1, min(cfg.max_num_seqs, cfg.max_num_batched_tokens // seq_len))
        blocks_per_seq = -(-seq_len // self.block_size)
        caches = self._kv_tensors(num_seqs * blocks_per_seq)
        num_tokens = num_seqs * seq_len
        slots = torch.arange(num_tokens, device=self.device)
        tables = torch.arange(num_seqs * blocks_per_seq, device=self.device, dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables.view(num_seqs, blocks_per_seq),
            context_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=self.device),
            query_start_loc=torch.arange(0, num_tokens + 1, seq_len, dtype=torch.int32, device=self.device),
            max_query_len=seq_len,
            max_context_len=seq_len,
            block_size=self.block_size,
        )
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(seq_len, device=self.device).repeat(num_seqs)
        hidden = self.model(ids, positions, caches, meta)
        rows = torch.arange(min(cfg.max_num_seqs, num_tokens), device=self.device) % num_tokens
        logits = self.model.compute_logits(hidden[rows])
        logits.log_softmax(dim=-1).topk(20, dim=-1)
        logits.sort(dim=-1)
        dummy = sum(c.numel() * c.element_size() for c in caches)
        del caches, hidden, logits
        return dummy

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self._kv_tensors(num_blocks)
        if self._use_cuda_graphs():
            assert self.config.max_model_len is not None
            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.config.max_num_seqs,
                                       self.config.max_model_len, self.block_size, self.device)
            self.graphs.capture()

    def _use_cuda_graphs(self) -> bool:
        """Decode graphs need CUDA, the Triton attention path (no host syncs) and a native model."""
        from engine.models import MODEL_REGISTRY

        cfg = self.config
        return (self.device.type == "cuda" and not cfg.enforce_eager and cfg.attn_backend == "triton"
                and type(self.model) in MODEL_REGISTRY.values())

    # -- one step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> StepResult:
        step = self.inputs.build(scheduled)  # copies queued before the forward: no host stall
        meta = step.meta
        # On an accelerator the grammar bitmask is filled in a helper thread while the forward runs.
        pending = PendingBitmask([item.seq.matcher for item in step.sampled], self.bitmask_words,
                                 self.device.type != "cpu")
        if self.graphs is not None and self.graphs.can_run(step.input_ids.shape[0], meta):
            hidden = self.graphs.run(step.input_ids, step.positions, meta)
        else:
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, meta)
        prompt_logprobs = {}
        if any(item.seq.prompt_logprobs is not None for item in scheduled):
            prompt_logprobs = compute_prompt_logprobs(self.model.compute_logits, hidden, scheduled, step.query_start)
        embeddings = {}
        if any(item.seq.pooling is not None for item in scheduled):
            embeddings = pool_step(hidden, scheduled, step.query_start)
        sampled = step.sampled
        if not sampled:
            return StepResult([], None, prompt_logprobs, embeddings)
        bitmask = pending.result()
        logits = self.model.compute_logits(hidden[step.sample_rows])
        output, failed = self._sample(logits, sampled, bitmask)
        return StepResult(sampled, output, prompt_logprobs, embeddings, failed)

    def _sample(self, logits: torch.Tensor, sampled: list[ScheduledSeq],
                bitmask: torch.Tensor | None) -> tuple[SamplerOutput, dict[int, Exception]]:
        """The batch's draw. Should it raise, each row is drawn alone, so a row that cannot be
        sampled fails its own request (its seq_id -> the error), never its batch mates. (Applying
        the bitmask twice is harmless: it adds 0 or -inf.)"""
        try:
            return self.sampler(logits, [self._row(item) for item in sampled], bitmask), {}
        except Exception:
            pass
        parts: list[SamplerOutput | None] = []
        failed: dict[int, Exception] = {}
        for j, item in enumerate(sampled):
            try:
                mask = bitmask[j : j + 1] if bitmask is not None else None
                parts.append(self.sampler(logits[j : j + 1], [self._row(item)], mask))
            except Exception as exc:
                failed[item.seq.seq_id] = exc
                parts.append(None)
        return join_rows(parts), failed

    def _row(self, item: ScheduledSeq) -> SamplingRow:
        seq = item.seq
        p = seq.params
        banned: list[int] = []
        if seq.num_output_tokens < p.min_tokens:
            banned = self.eos_token_ids + list(p.stop_token_ids)
        return SamplingRow(p, seq.prompt_token_ids, seq.output_token_ids, seq.generator, banned)
