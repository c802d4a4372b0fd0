"""The simulator's paged KV cache: prefix hits by hash chain, reference counts, LRU eviction, events."""

from __future__ import annotations

import pytest

from extproc.simulator.kv_cache import Allocation, Cleared, KvCache, KvEvent, NoFreeBlocks, Removed, Stored

BS = 4


def make(num_blocks: int = 8) -> tuple[KvCache, list[KvEvent]]:
    events: list[KvEvent] = []
    return KvCache(num_blocks, BS, events.append), events


def admit(cache: KvCache, tokens: list[int]) -> tuple[Allocation, int]:
    """Allocate a whole prompt as the scheduler does: cached prefix, then fresh blocks; compute it all."""
    allocation = Allocation()
    hashes = cache.chain_hashes(tokens)
    hit = min(cache.longest_hit(hashes), (len(tokens) - 1) // BS)
    cache.allocate_prefix(hashes, hit, allocation)
    cache.allocate(-(-len(tokens) // BS) - hit, allocation)
    cache.publish_full_blocks(allocation, tokens, len(tokens))
    return allocation, hit


def test_full_blocks_are_stored_once_as_a_chained_run() -> None:
    cache, events = make()
    tokens = list(range(10))  # two full blocks and a partial one
    allocation, hit = admit(cache, tokens)
    assert hit == 0 and cache.used_blocks == 3
    [stored] = events
    assert isinstance(stored, Stored) and stored.parent_hash is None and stored.block_size == BS
    assert stored.token_ids == tuple(range(8)) and stored.block_hashes == tuple(cache.chain_hashes(tokens))
    cache.free(allocation)
    assert cache.used_blocks == 0 and cache.cached_blocks == 2  # freed, still cached


def test_shared_prefix_hits_and_only_new_blocks_are_stored() -> None:
    cache, events = make()
    first, _ = admit(cache, list(range(9)))
    events.clear()
    second, hit = admit(cache, [*range(8), 50, 51, 52, 53, 54])
    assert hit == 2
    assert first.blocks[:2] == second.blocks[:2] and first.blocks[0].ref_count == 2  # shared, counted
    [stored] = events
    assert stored.parent_hash == cache.chain_hashes(list(range(8)))[-1]
    assert stored.token_ids == (50, 51, 52, 53)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    cache, _ = make()
    admit(cache, list(range(8)))
    _, hit = admit(cache, list(range(8)))
    assert hit == 1  # (8 - 1) // 4: the last block is recomputed


def test_lru_eviction_takes_oldest_freed_blocks_tail_first_and_reports_removed() -> None:
    cache, events = make(num_blocks=4)
    a, _ = admit(cache, list(range(8)))  # blocks a0, a1
    b, _ = admit(cache, list(range(100, 108)))  # blocks b0, b1
    cache.free(a)  # freed tail first: a1 then a0
    cache.free(b)
    a_hashes = cache.chain_hashes(list(range(8)))
    events.clear()
    admit(cache, list(range(200, 204)))  # needs one block: the least recently freed, a's last block
    removed = [e for e in events if isinstance(e, Removed)]
    assert removed == [Removed((a_hashes[1],))]
    assert cache.longest_hit(a_hashes) == 1  # a's first block survives
    assert cache.longest_hit(cache.chain_hashes(list(range(100, 108)))) == 2


def test_blocks_in_use_are_never_evicted() -> None:
    cache, _ = make(num_blocks=2)
    admit(cache, list(range(8)))
    with pytest.raises(NoFreeBlocks):
        cache.allocate(1, Allocation())


def test_reset_clears_only_an_idle_cache() -> None:
    cache, events = make()
    allocation, _ = admit(cache, list(range(8)))
    assert not cache.reset()
    cache.free(allocation)
    assert cache.reset() and events[-1] == Cleared()
    assert cache.cached_blocks == 0 and cache.longest_hit(cache.chain_hashes(list(range(8)))) == 0


def test_hashes_chain_on_the_parent() -> None:
    cache, _ = make()
    # The same block content after different prefixes is a different block.
    assert cache.chain_hashes([1, 2, 3, 4, 9, 9, 9, 9])[1] != cache.chain_hashes([5, 6, 7, 8, 9, 9, 9, 9])[1]
    assert cache.chain_hashes([1, 2, 3]) == []
