"""A paged KV cache with prefix caching, as vLLM's v1 block pool keeps it.

- A fixed number of blocks of `block_size` token slots. A request holds the blocks its tokens fill.
- A full block is identified by a hash chained from its parent block's hash and its own token ids, so
  equal hashes mean equal prefixes. Full blocks are published in a hash → block map (prefix caching).
- Reference counts: blocks shared by requests with a common prefix are held once. A block whose count
  drops to 0 goes to the tail of the free queue but stays cached; allocation takes free blocks from the
  head (least recently freed first), and only then is a cached block evicted.
- A request frees its blocks tail first (vLLM frees them reversed), so a prompt's last blocks are evicted
  before its first ones, which more requests share.
- Events, as vLLM publishes them: `Stored` when full blocks enter the map (one event per run of
  consecutive blocks, with its parent's hash and their token ids), `Removed` when an evicted block leaves
  it, `Cleared` when the whole cache is reset. Nothing else changes the map, so nothing else emits.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stored:
    block_hashes: tuple[int, ...]
    parent_hash: int | None
    token_ids: tuple[int, ...]  # every stored block's tokens, concatenated
    block_size: int


@dataclass(frozen=True)
class Removed:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class Cleared:
    pass


KvEvent = Stored | Removed | Cleared


def block_hash(parent: int | None, token_ids: Sequence[int], seed: int = 0) -> int:
    """A signed 64-bit content hash of a block given its parent's (KvBlock.block_hash is an int64)."""
    digest = hashlib.blake2b(digest_size=8, key=seed.to_bytes(8, "little"))
    digest.update((parent if parent is not None else 0).to_bytes(8, "little", signed=True))
    digest.update(array("I", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little", signed=True)


@dataclass
class Block:
    index: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is in the prefix map


@dataclass
class Allocation:
    """The blocks one request holds, and how many of its tokens are in published full blocks."""

    blocks: list[Block] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chain hashes of its full, published blocks


class NoFreeBlocks(Exception):
    """Not enough free blocks for the request right now (it waits, or something is preempted)."""


class KvCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        on_event: Callable[[KvEvent], None] | None = None,
        hash_seed: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_seed = hash_seed
        self._on_event = on_event or (lambda event: None)
        self._blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (head first); cached or not. A dict keeps insertion order and
        # removes from the middle in O(1) when a hit revives a free cached block.
        self._free: OrderedDict[int, Block] = OrderedDict((b.index, b) for b in self._blocks)
        self._by_hash: dict[int, Block] = {}
        # Prefix-cache statistics, as vLLM's metrics count them (in tokens).
        self.queries = 0
        self.hits = 0

    # --- inspection -----------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage: cached free blocks are free)."""
        return self.used_blocks / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._by_hash)

    def chain_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The hashes of the full blocks of `token_ids`, chained from the first."""
        hashes: list[int] = []
        parent: int | None = None
        size = self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            parent = block_hash(parent, token_ids[start : start + size], self.hash_seed)
            hashes.append(parent)
        return hashes

    def is_free(self, block_hash: int) -> bool:
        """Whether a cached block is held by no request (taking it shrinks the free pool)."""
        block = self._by_hash.get(block_hash)
        return block is not None and block.ref_count == 0

    def longest_hit(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of the chain are cached."""
        count = 0
        for h in hashes:
            if h not in self._by_hash:
                break
            count += 1
        return count

    # --- allocation -----------------------------------------------------------------------------

    def allocate_prefix(self, hashes: Sequence[int], hit_blocks: int, allocation: Allocation) -> None:
        """Take references on the first `hit_blocks` cached blocks of a chain (the prefix-cache hit)."""
        for h in hashes[:hit_blocks]:
            block = self._by_hash[h]
            if block.ref_count == 0:
                del self._free[block.index]
            block.ref_count += 1
            allocation.blocks.append(block)
            allocation.hashes.append(h)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int, allocation: Allocation) -> None:
        """Append `count` fresh blocks to a request, evicting cached free blocks as needed."""
        if count > len(self._free):
            raise NoFreeBlocks(f"{count} blocks wanted, {len(self._free)} free")
        evicted: list[int] = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                del self._by_hash[block.hash]
                evicted.append(block.hash)
                block.hash = None
            block.ref_count = 1
            allocation.blocks.append(block)
        if evicted:
            self._on_event(Removed(tuple(evicted)))

    def publish_full_blocks(self, allocation: Allocation, token_ids: Sequence[int], computed: int) -> None:
        """Publish the request's blocks that `computed` tokens now fill completely (vLLM's cache_full_blocks).

        A block whose hash is already mapped (another request computed the same prefix meanwhile) is not
        published again: the map keeps the first, as vLLM does, and no event is sent for the duplicate.
        """
        size = self.block_size
        full = min(computed // size, len(allocation.blocks))
        done = len(allocation.hashes)
        if full <= done:
            return
        parent = allocation.hashes[-1] if allocation.hashes else None
        run_parent: int | None = None
        run_hashes: list[int] = []
        run_tokens: list[int] = []
        for i in range(done, full):
            tokens = token_ids[i * size : (i + 1) * size]
            h = block_hash(parent, tokens, self.hash_seed)
            allocation.hashes.append(h)
            block = allocation.blocks[i]
            if h not in self._by_hash:
                if not run_hashes:
                    run_parent = parent
                block.hash = h
                self._by_hash[h] = block
                run_hashes.append(h)
                run_tokens.extend(tokens)
            elif run_hashes:  # a duplicate breaks the run: what was gathered goes out as one event
                self._emit_stored(run_parent, run_hashes, run_tokens)
                run_hashes, run_tokens = [], []
            parent = h
        if run_hashes:
            self._emit_stored(run_parent, run_hashes, run_tokens)

    def _emit_stored(self, parent: int | None, hashes: list[int], tokens: list[int]) -> None:
        self._on_event(Stored(tuple(hashes), parent, tuple(tokens), self.block_size))

    def free(self, allocation: Allocation) -> None:
        """Drop a request's references, last block first; blocks at 0 join the free queue's tail."""
        for block in reversed(allocation.blocks):
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.index] = block
        allocation.blocks.clear()
        allocation.hashes.clear()

    def reset(self) -> bool:
        """Drop every cached block (vLLM's reset_prefix_cache); refused while requests hold blocks."""
        if self.used_blocks:
            return False
        for block in self._by_hash.values():
            block.hash = None
        self._by_hash.clear()
        self._on_event(Cleared())
        return True
