"""KV block accounting: a block pool (free lists, ref counts, prefix-cache map) and the
per-sequence manager on top of it. Scheduling policy lives in the scheduler, not here.

Prefix caching: a full block is named by a hash chained over (parent hash, its token ids); the
root's parent is the sequence's cache salt. A block is named only once its K/V are written
(``cache_computed_blocks``, after the step that computed them), so a block that was scheduled but
never computed (the step failed, or its sequence was preempted first) can never be a hit. A cached
block stays cached after its last user releases it and is evicted (least recently freed first)
only when no never-cached block is left. Hits are verified against the stored tokens, salt and
parent link, so a hash collision can only cost a miss, never wrong output.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.sequence import Sequence

HashFn = Callable[[int, tuple[int, ...]], int]


def default_block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    hash: int | None = None
    cache_id: int = 0  # unique per registration; 0 = not cached
    parent_cache_id: int = 0
    salt: int = 0
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PrefixCacheSummary:
    """What a router may know of an engine's prefix cache: its size and which prompts it holds."""

    num_blocks: int
    num_free_blocks: int
    cached_blocks: int
    cached_chains: int  # cached first blocks = distinct cached prefixes
    root_hashes: list[int]  # hashes of the cached first blocks, most recently registered last


class BlockPool:
    """Owns every block: who holds it, whether it is free, what it caches."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU order, oldest first
        self._by_hash: dict[int, Block] = {}
        self._cache_ids = itertools.count(1)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} blocks with {self.num_free} free")
        ids: list[int] = []
        for _ in range(n):
            if self._free_uncached:
                block = self.blocks[self._free_uncached.popleft()]
            else:
                block_id, _ = self._free_cached.popitem(last=False)
                block = self.blocks[block_id]
                self._uncache(block)
            block.ref_cnt = 1
            ids.append(block.block_id)
        return ids

    def acquire(self, block: Block) -> None:
        """Take a reference on a cached block found by lookup (revives it if free)."""
        if block.ref_cnt == 0:
            del self._free_cached[block.block_id]
        block.ref_cnt += 1

    def release(self, block_ids: list[int], keep_cached: bool = True) -> None:
        """Drop one reference from each block; tail blocks first, so they are evicted first."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block_id} released more often than acquired")
            block.ref_cnt -= 1
            if block.ref_cnt:
                continue
            if block.cache_id and not keep_cached:
                self._uncache(block)
            if block.cache_id:
                self._free_cached[block_id] = None
            else:
                self._free_uncached.append(block_id)

    def lookup(self, h: int, parent_cache_id: int, salt: int, tokens: tuple[int, ...]) -> Block | None:
        block = self._by_hash.get(h)
        if (
            block is None
            or block.parent_cache_id != parent_cache_id
            or block.salt != salt
            or block.token_ids != tokens
        ):
            return None
        return block

    def register(
        self, block_id: int, h: int, parent_cache_id: int, salt: int, tokens: tuple[int, ...]
    ) -> int | None:
        """Cache a just-filled block; return the chain id for its position.

        If an equal block is already cached, that block's id is returned (this one stays
        private). If a different block holds the hash (a collision, or a child named under a
        since-evicted parent, which no lookup can reach), it gives way when free; while a sequence
        holds it, return None.
        """
        existing = self._by_hash.get(h)
        if existing is not None:
            if self.lookup(h, parent_cache_id, salt, tokens) is existing:
                return existing.cache_id
            if existing.ref_cnt:
                return None
            del self._free_cached[existing.block_id]
            self._uncache(existing)
            self._free_uncached.append(existing.block_id)
        block = self.blocks[block_id]
        block.hash, block.parent_cache_id, block.salt, block.token_ids = h, parent_cache_id, salt, tokens
        block.cache_id = next(self._cache_ids)
        self._by_hash[h] = block
        return block.cache_id

    def _uncache(self, block: Block) -> None:
        assert block.hash is not None
        del self._by_hash[block.hash]
        block.hash, block.cache_id, block.parent_cache_id, block.token_ids = None, 0, 0, ()


@dataclass
class _ChainState:
    num_registered: int = 0  # leading blocks of the table that are named in the cache
    last_cache_id: int = 0
    broken: bool = False  # a collision stopped registration for this sequence


class BlockManager:
    """Gives sequences the blocks for their tokens, sharing cached full blocks."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_fn: HashFn = default_block_hash,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_fn = hash_fn
        self._chains: dict[int, _ChainState] = {}
        self.prefix_queries = 0  # prompt tokens looked up on first admission (once per sequence)
        self.prefix_hits = 0  # of which found in the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cache_summary(self, max_roots: int) -> PrefixCacheSummary:
        """The cache's size and the hashes of (at most ``max_roots``, newest) cached first blocks."""
        cached = [b for b in self.pool.blocks if b.cache_id]
        roots = sorted((b for b in cached if b.parent_cache_id == 0), key=lambda b: b.cache_id)
        hashes = [b.hash for b in roots[-max_roots:] if b.hash is not None]
        return PrefixCacheSummary(self.num_blocks, self.num_free_blocks, len(cached), len(roots), hashes)

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _extend_hashes(self, seq: Sequence, num_full: int) -> None:
        hashes = seq.block_hashes
        while len(hashes) < num_full:
            parent = hashes[-1] if hashes else seq.cache_salt
            hashes.append(self.hash_fn(parent, self._block_tokens(seq, len(hashes))))

    def find_cached_prefix(self, seq: Sequence) -> list[Block]:
        """Cached blocks covering a leading part of ``seq`` (never all its tokens: the last
        token must be computed to sample, so a full hit gives up its last block)."""
        num_full = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, num_full)
        hits: list[Block] = []
        if seq.computes_whole_prompt:
            return hits
        parent = 0
        for i in range(num_full):
            block = self.pool.lookup(
                seq.block_hashes[i], parent, seq.cache_salt, self._block_tokens(seq, i)
            )
            if block is None:
                break
            hits.append(block)
            parent = block.cache_id
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[Block] | None = None) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` (after taking ``cached``
        blocks on admission). Return False, changing nothing, if the pool is too small."""
        cached = cached or []
        num_cached_tokens = len(cached) * self.block_size
        total = seq.num_computed_tokens + num_cached_tokens + num_new_tokens
        need = self.blocks_for(total) - len(seq.block_table) - len(cached)
        revived = sum(1 for b in cached if b.ref_cnt == 0)
        if need + revived > self.pool.num_free:
            return False
        if not seq.block_table and seq.num_preemptions == 0:  # a readmission is not a new query
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += num_cached_tokens
        for block in cached:
            self.pool.acquire(block)
            seq.block_table.append(block.block_id)
        chain = self._chains.setdefault(seq.seq_id, _ChainState())
        if cached:
            chain.num_registered = len(cached)
            chain.last_cache_id = cached[-1].cache_id
            seq.num_computed_tokens += num_cached_tokens
        if need > 0:
            seq.block_table.extend(self.pool.allocate(need))
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Name in the prefix cache the full blocks of ``seq`` whose K/V are now written (its first
        ``num_computed_tokens`` tokens); call after each step that computed tokens of ``seq``."""
        chain = self._chains.get(seq.seq_id)
        if chain is not None:
            self._register_full_blocks(seq, chain, seq.num_computed_tokens // self.block_size)

    def _register_full_blocks(self, seq: Sequence, chain: _ChainState, num_full: int) -> None:
        if chain.broken or chain.num_registered >= num_full:
            return
        self._extend_hashes(seq, num_full)
        for i in range(chain.num_registered, num_full):
            cache_id = self.pool.register(
                seq.block_table[i],
                seq.block_hashes[i],
                chain.last_cache_id,
                seq.cache_salt,
                self._block_tokens(seq, i),
            )
            if cache_id is None:
                chain.broken = True
                return
            chain.num_registered, chain.last_cache_id = i + 1, cache_id

    def free(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks (finish, abort or preemption)."""
        self.pool.release(seq.block_table, keep_cached=self.enable_caching)
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._chains.pop(seq.seq_id, None)
