"""One step's integer inputs, staged without stalling the host.

Every id, position, slot, length and sampling row of a step is written into two persistent host
buffers (pinned on CUDA: one int64, one int32) and sent with one ``non_blocking`` copy each, queued
before the forward pass. Block tables live on the device (``DeviceBlockTable``): a sequence's row
is written once and then only its new blocks are sent; a step's ``[S, width]`` table is gathered
from those rows on the device.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from engine.attention_metadata import AttentionMetadata
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence


class _Staging:
    """A growable host buffer and its device twin; ``send`` fills one and queues the copy."""

    def __init__(self, dtype: torch.dtype, device: torch.device, capacity: int = 4096) -> None:
        self.dtype, self.device = dtype, device
        self.pinned = device.type == "cuda"
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.host = torch.empty(capacity, dtype=self.dtype, pin_memory=self.pinned)
        self.view = self.host.numpy()  # list -> buffer through numpy: no temporary tensor
        # On the CPU the host buffer is the device buffer: nothing to copy.
        self.dev = torch.empty(capacity, dtype=self.dtype, device=self.device) if self.pinned else self.host

    def send(self, parts: Seq[Seq[int]]) -> list[torch.Tensor]:
        """Copy ``parts`` to the device in one transfer; return their device views, in order."""
        total = sum(len(p) for p in parts)
        if total > self.host.numel():
            self._allocate(max(total, 2 * self.host.numel()))
        offset = 0
        for part in parts:
            self.view[offset:offset + len(part)] = part
            offset += len(part)
        if self.pinned:
            self.dev[:total].copy_(self.host[:total], non_blocking=True)
        return list(self.dev[:total].split([len(p) for p in parts]))


@dataclass
class _Row:
    index: int
    blocks: list[int]  # the sequence's block table object this row mirrors
    written: int  # entries of ``blocks`` already on the device
    last_step: int


class DeviceBlockTable:
    """Block tables of the sequences in flight, one row each, kept on the device.

    A block table only grows, or is replaced by a new list when its sequence is freed (finish,
    preemption): a row whose list is still the same object needs only its new entries sent. Rows
    of sequences absent from a step are reclaimed when rows run out. Entries past a sequence's
    blocks are stale block ids from an earlier owner; kernels never read past a context length.
    """

    def __init__(self, rows: int, max_blocks: int, device: torch.device) -> None:
        self.table = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        self.rows: dict[int, _Row] = {}
        self.free = list(range(rows - 1, -1, -1))
        self.step = 0

    def _take_row(self) -> int:
        if not self.free:  # reclaim the rows of sequences not in this step
            for seq_id in [k for k, r in self.rows.items() if r.last_step < self.step]:
                self.free.append(self.rows.pop(seq_id).index)
        if not self.free:
            old = self.table
            self.table = old.new_zeros(2 * old.shape[0], old.shape[1])
            self.table[: old.shape[0]] = old
            self.free = list(range(self.table.shape[0] - 1, old.shape[0] - 1, -1))
        return self.free.pop()

    def plan(self, seqs: Seq[Sequence]) -> tuple[list[int], list[int], list[int]]:
        """Assign rows for this step's sequences; return (row of each sequence, flat positions
        in the table to update, their block ids)."""
        self.step += 1
        width = max(len(s.block_table) for s in seqs)
        if width > self.table.shape[1]:
            old = self.table
            self.table = old.new_zeros(old.shape[0], max(width, 2 * old.shape[1]))
            self.table[:, : old.shape[1]] = old
        cols = self.table.shape[1]
        rows: list[int] = []
        where: list[int] = []
        values: list[int] = []
        for seq in seqs:
            row = self.rows.get(seq.seq_id)
            if row is None:
                row = self.rows[seq.seq_id] = _Row(self._take_row(), seq.block_table, 0, self.step)
            elif row.blocks is not seq.block_table or len(seq.block_table) < row.written:
                row.blocks, row.written = seq.block_table, 0
            row.last_step = self.step
            new = seq.block_table[row.written:]
            if new:
                base = row.index * cols + row.written
                where.extend(range(base, base + len(new)))
                values.extend(new)
                row.written += len(new)
            rows.append(row.index)
        return rows, where, values

    def gather(self, rows: torch.Tensor, where: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
        """Apply the updates (device tensors from ``plan``'s lists) and return the step's
        ``[S, width]`` block table."""
        if where.numel():
            self.table.view(-1).index_copy_(0, where, values)
        if self.table.device.type == "cpu":  # numpy's take is many times faster than index_select here
            return torch.from_numpy(self.table[:, :width].numpy().take(rows.numpy(), axis=0))
        return self.table[:, :width].index_select(0, rows)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the hidden states that sample a token
    sampled: list[ScheduledSeq]  # the scheduled sequences that sample, in the same order
    query_start: list[int]  # host copy of ``meta.query_start_loc``


class StepInputBuilder:
    """Builds each step's ``StepInputs`` from the scheduled sequences (see the module doc)."""

    def __init__(self, device: torch.device, max_num_seqs: int, max_blocks: int, block_size: int) -> None:
        self.device = device
        self.block_size = block_size
        self.longs = _Staging(torch.int64, device)
        self.ints = _Staging(torch.int32, device)
        self.tables = DeviceBlockTable(2 * max_num_seqs, max_blocks, device)
        self.copied: torch.cuda.Event | None = None

    def build(self, scheduled: Seq[ScheduledSeq]) -> StepInputs:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        sample_rows: list[int] = []
        sampled: list[ScheduledSeq] = []
        for item in scheduled:
            seq, n = item.seq, item.num_new_tokens
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            table = seq.block_table
            ids.extend(seq.token_ids[start:end])
            if n == 1:
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                span = range(start, end)
                positions.extend(span)
                slots.extend([table[p // bs] * bs + p % bs for p in span])
            query_start.append(query_start[-1] + n)
            context_lens.append(end)
            if item.samples and seq.pooling is None:
                sample_rows.append(query_start[-1] - 1)
                sampled.append(item)
        seqs = [item.seq for item in scheduled]
        rows, where, values = self.tables.plan(seqs)
        if self.copied is not None:  # the last step's copies must have left the pinned buffers
            self.copied.synchronize()
        ids_t, pos_t, slots_t, sample_t, rows_t, where_t = self.longs.send(
            [ids, positions, slots, sample_rows, rows, where])
        qsl_t, ctx_t, values_t = self.ints.send([query_start, context_lens, values])
        if self.device.type == "cuda":
            self.copied = torch.cuda.Event()
            self.copied.record()
        width = max(len(s.block_table) for s in seqs)
        q_lens = [item.num_new_tokens for item in scheduled]
        meta = AttentionMetadata(
            slot_mapping=slots_t,
            block_tables=self.tables.gather(rows_t, where_t, values_t, width),
            context_lens=ctx_t,
            query_start_loc=qsl_t,
            max_query_len=max(q_lens),
            max_context_len=max(context_lens),
            block_size=bs,
            query_lens_host=q_lens,
            context_lens_host=context_lens,
            all_slots_valid=True,
        )
        return StepInputs(ids_t, pos_t, meta, sample_t, sampled, query_start)
