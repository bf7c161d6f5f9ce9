"""Step inputs: the device-resident block table is updated incrementally and always equals the
sequences' block tables; the staged buffers hold each step's values (CPU: no copies)."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence
from engine.step_inputs import DeviceBlockTable, StepInputBuilder, _Staging

CPU = torch.device("cpu")


def seq(tokens: int, blocks: list[int]) -> Sequence:
    s = Sequence("r", list(range(tokens)), SamplingParams(max_tokens=4))
    s.block_table = blocks
    return s


def step_table(table: DeviceBlockTable, seqs: list[Sequence]) -> tuple[torch.Tensor, int]:
    rows, where, values = table.plan(seqs)
    width = max(len(s.block_table) for s in seqs)
    got = table.gather(torch.tensor(rows), torch.tensor(where, dtype=torch.long),
                       torch.tensor(values, dtype=torch.int32), width)
    for i, s in enumerate(seqs):
        assert got[i, : len(s.block_table)].tolist() == s.block_table
    return got, len(where)


def test_block_table_sends_only_new_blocks_and_rewrites_a_replaced_table() -> None:
    table = DeviceBlockTable(rows=4, max_blocks=4, device=CPU)
    a, b = seq(20, [3, 7]), seq(5, [1])
    assert step_table(table, [a, b])[1] == 3  # first sight: whole tables
    assert step_table(table, [b, a])[1] == 0  # order changed, nothing new
    a.block_table.append(9)
    assert step_table(table, [a, b])[1] == 1  # only the new block
    b.block_table = [5, 6]  # freed (preempted) and allocated again: a new list
    assert step_table(table, [a, b])[1] == 2
    a.block_table.extend([10, 11, 12])  # wider than the table was made: it grows
    got, sent = step_table(table, [a])
    assert sent == 3 and got.shape == (1, 6)


def test_block_table_reclaims_rows_of_absent_sequences_and_grows_when_needed() -> None:
    table = DeviceBlockTable(rows=2, max_blocks=2, device=CPU)
    first = [seq(3, [i]) for i in range(2)]
    step_table(table, first)
    later = [seq(3, [10 + i]) for i in range(2)]
    step_table(table, later)  # the first two are absent: their rows are reused
    assert table.table.shape[0] == 2
    step_table(table, later + first)  # four at once: the table doubles
    assert table.table.shape[0] == 4


def test_staging_grows_and_returns_views_in_order() -> None:
    staging = _Staging(torch.int64, CPU, capacity=2)
    a, b, c = staging.send([[1, 2, 3], [], [4]])
    assert (a.tolist(), b.tolist(), c.tolist()) == ([1, 2, 3], [], [4])


def test_builder_lays_out_a_mixed_step() -> None:
    builder = StepInputBuilder(CPU, max_num_seqs=4, max_blocks=2, block_size=4)
    prefill = seq(6, [2, 5])
    decode = seq(3, [8])
    decode.num_computed_tokens = 2
    scheduled = [ScheduledSeq(prefill, 6), ScheduledSeq(decode, 1)]
    step = builder.build(scheduled)
    meta = step.meta
    assert step.input_ids.tolist() == [0, 1, 2, 3, 4, 5, 2]
    assert step.positions.tolist() == [0, 1, 2, 3, 4, 5, 2]
    assert meta.slot_mapping.tolist() == [8, 9, 10, 11, 20, 21, 34]
    assert meta.query_start_loc.tolist() == [0, 6, 7] and meta.context_lens.tolist() == [6, 3]
    assert meta.block_tables[0].tolist() == [2, 5] and meta.block_tables[1, 0] == 8
    assert step.sample_rows.tolist() == [5, 6] and step.query_start == [0, 6, 7]
    assert (meta.max_query_len, meta.max_context_len, meta.query_lens_host) == (6, 6, [6, 1])
