"""Block pool / block manager invariants: ref counts, prefix sharing, LRU, collision safety."""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

BS = 4


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=8))


def admit(bm: BlockManager, s: Sequence) -> int:
    """Admit ``s`` whole; return the number of prompt tokens found in the cache."""
    cached = bm.find_cached_prefix(s)
    assert bm.allocate(s, s.num_tokens - len(cached) * BS, cached)
    hit = len(cached) * BS
    s.num_computed_tokens = s.num_tokens  # the step ran: its full blocks become prefix hits
    bm.cache_computed_blocks(s)
    return hit


def test_allocate_and_free_leaves_no_leak() -> None:
    bm = BlockManager(16, BS)
    seqs = [seq(list(range(i, i + 10)), f"r{i}") for i in range(4)]
    for s in seqs:
        admit(bm, s)
        assert len(s.block_table) == 3
    assert bm.num_free_blocks == 16 - 12
    for s in seqs:
        bm.free(s)
    assert bm.num_free_blocks == 16
    assert all(b.ref_cnt == 0 for b in bm.pool.blocks)


def test_shared_prefix_blocks_are_ref_counted() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(100, 110))  # 2 full blocks + 2 tokens
    a, b = seq(prompt, "a"), seq(prompt + [7], "b")
    assert admit(bm, a) == 0
    assert admit(bm, b) == 8
    assert a.block_table[:2] == b.block_table[:2]
    assert a.block_table[2] != b.block_table[2]
    assert [bm.pool.blocks[i].ref_cnt for i in a.block_table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.pool.blocks[i].ref_cnt for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_cached_blocks_survive_release_and_are_reused() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(12))
    a = seq(prompt + [99], "a")
    admit(bm, a)
    first_blocks = a.block_table[:3]
    bm.free(a)
    b = seq(prompt + [98], "b")
    assert admit(bm, b) == 12
    assert b.block_table[:3] == first_blocks
    assert bm.prefix_hits == 12 and bm.prefix_queries == 26


def test_full_hit_still_computes_last_token() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(8))
    a = seq(prompt, "a")
    admit(bm, a)
    b = seq(prompt, "b")
    cached = bm.find_cached_prefix(b)
    assert len(cached) == 1  # the last block is given up so its last token is recomputed


def test_free_uncached_blocks_are_used_before_evicting_cached_ones() -> None:
    bm = BlockManager(6, BS)
    a = seq(list(range(8)) + [1], "a")  # 2 full blocks cached + 1 partial
    admit(bm, a)
    bm.free(a)
    assert bm.pool.num_cached == 2
    b = seq([50, 51, 52], "b")
    admit(bm, b)  # one block: there are uncached free blocks, so nothing is evicted
    assert bm.pool.num_cached == 2
    c = seq(list(range(200, 215)), "c")  # needs 4 blocks, 5 free of which 2 cached
    admit(bm, c)
    assert bm.pool.num_cached < 2 + 3  # had to evict at least one cached block
    bm.free(b)
    bm.free(c)
    assert bm.num_free_blocks == 6


def test_lru_evicts_least_recently_freed_first() -> None:
    bm = BlockManager(4, BS)
    old, new = seq(list(range(4)) + [0], "old"), seq(list(range(10, 14)) + [0], "new")
    admit(bm, old)
    bm.free(old)
    admit(bm, new)
    bm.free(new)
    big = seq(list(range(30, 42)), "big")  # 3 blocks: 2 never-cached + one eviction
    admit(bm, big)
    bm.free(big)
    assert admit(bm, seq(list(range(10, 14)) + [5], "again")) == 4  # "new" kept
    assert admit(bm, seq(list(range(4)) + [5], "older")) == 0  # "old" evicted


def test_hash_collisions_never_give_wrong_blocks() -> None:
    bm = BlockManager(32, BS, hash_fn=lambda parent, toks: 42)  # every block collides
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    admit(bm, a)
    b = seq([9, 9, 9, 9, 5, 6, 7, 8, 9], "b")  # same second block, different first
    assert admit(bm, b) == 0
    c = seq([1, 2, 3, 4, 9, 9, 9, 9, 9], "c")  # first block equal -> verified hit
    assert admit(bm, c) == 4
    assert c.block_table[0] == a.block_table[0]
    for s in (a, b, c):
        bm.free(s)
    assert bm.num_free_blocks == 32


def test_chain_link_checked_when_a_parent_block_is_reused() -> None:
    """Same tokens under a different parent must not match, even with identical hashes."""
    bm = BlockManager(32, BS, hash_fn=lambda parent, toks: hash(toks))  # ignores the parent
    a = seq([1, 1, 1, 1, 2, 2, 2, 2, 0], "a")
    admit(bm, a)
    b = seq([3, 3, 3, 3, 2, 2, 2, 2, 0], "b")
    assert admit(bm, b) == 0


def test_cache_salt_isolates_requests_when_caching_is_off() -> None:
    bm = BlockManager(16, BS, enable_caching=False)
    a, a2 = seq(list(range(9)), "a"), seq(list(range(9)), "a")
    a.cache_salt = a2.cache_salt = 11
    other = seq(list(range(9)), "o")
    other.cache_salt = 12
    admit(bm, a)
    assert admit(bm, a2) == 8  # a sibling shares the prompt's full blocks
    assert admit(bm, other) == 0
    for s in (a, a2, other):
        bm.free(s)
    assert bm.pool.num_cached == 0  # nothing kept after release with caching off
    assert bm.num_free_blocks == 16


def test_allocate_fails_cleanly_when_out_of_blocks() -> None:
    bm = BlockManager(2, BS)
    s = seq(list(range(12)), "s")
    assert not bm.allocate(s, 12)
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_blocks_scheduled_but_never_computed_are_not_prefix_hits() -> None:
    """A block is named in the prefix cache only once its K/V are written: a sequence freed
    before its step ran (a failed step, or preempted in the call that allocated it) leaves nothing
    findable, so a later identical prompt cannot read unwritten K/V."""
    bm = BlockManager(16, BS)
    prompt = list(range(12))
    a = seq(prompt + [99], "a")
    assert bm.allocate(a, a.num_tokens)  # scheduled; the step never ran
    assert bm.find_cached_prefix(seq(prompt + [98], "x")) == []  # not a hit while unwritten
    bm.free(a)
    assert bm.pool.num_cached == 0
    assert admit(bm, seq(prompt + [98], "b")) == 0


def test_chunked_prefill_caches_only_the_computed_chunks() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(13))
    a = seq(prompt, "a")
    assert bm.allocate(a, 8)
    a.num_computed_tokens = 8  # first chunk ran
    bm.cache_computed_blocks(a)
    assert bm.allocate(a, 5)  # second chunk scheduled (fills block 3), then the step fails
    bm.free(a)
    assert bm.pool.num_cached == 2
    assert admit(bm, seq(prompt + [1], "b")) == 8


def test_a_block_orphaned_by_its_parents_eviction_does_not_block_the_chain_for_good() -> None:
    """Two identical prompts computed in the same step: the second's prompt blocks stay private and
    its later blocks are named under the first's. Once the first's blocks are evicted, such a child
    can never be hit again; it must not stop a fresh computation of the same chain from being cached."""
    bm = BlockManager(8, BS)
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    a, b = seq(shared + [0], "a"), seq(shared + [9, 9, 9, 9, 0], "b")
    for s in (a, b):  # admitted together: neither finds the other's blocks yet
        assert bm.allocate(s, s.num_tokens, bm.find_cached_prefix(s))
    for s in (a, b):
        s.num_computed_tokens = s.num_tokens
        bm.cache_computed_blocks(s)
    bm.free(a)
    bm.free(b)  # cached and free, oldest first: a's two blocks, then b's [9, 9, 9, 9]
    filler = seq(list(range(100, 128)), "filler")
    assert bm.allocate(filler, 28) and bm.pool.num_cached == 1  # a's blocks evicted, b's child kept
    bm.free(filler)
    c = seq(shared + [9, 9, 9, 9, 0], "c")
    assert admit(bm, c) == 0
    bm.free(c)
    assert admit(bm, seq(shared + [9, 9, 9, 9, 5], "d")) == 12
