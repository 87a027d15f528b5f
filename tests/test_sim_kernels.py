"""The request-granular kernels for chained ids against block-level replays on random tries.

``replay_fixed_chained`` and ``stack_depth_histogram_chained`` keep the LRU as one entry per
request; here they must agree, request by request and depth by depth, with a plain
OrderedDict LRU written in the test and with the block-level kernels.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from numpy.typing import NDArray

from pipeline.cache_rules import hit_limit_blocks
from pipeline.sim import kernels

I64 = NDArray[np.int64]
B = 4


def random_trie_workload(
    seed: int, n: int, *, max_new: int = 6, max_missing: int = 3
) -> tuple[I64, I64, I64, I64, I64, int]:
    """Requests whose chains are root paths of one random trie (a proper hash-chain workload).

    Each request takes a random prefix of an earlier request's chain (or nothing) and extends
    it with fresh blocks; prompt blocks, prompt tokens and unknown output blocks are random.
    """
    rng = np.random.default_rng(seed)
    chains: list[list[int]] = []
    next_id = 0
    for _ in range(n):
        base: list[int] = []
        if chains and rng.random() < 0.8:
            parent = chains[int(rng.integers(len(chains)))]
            base = parent[: int(rng.integers(0, len(parent) + 1))]
        grow = int(rng.integers(0, max_new + 1))
        chain = base + list(range(next_id, next_id + grow))
        next_id += grow
        chains.append(chain)
    lens = np.array([len(c) for c in chains], np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    ids = np.array([b for c in chains for b in c], np.int64)
    prompt_blocks = np.array([int(rng.integers(0, ln + 1)) for ln in lens], np.int64)
    prompt_tokens = prompt_blocks * B + rng.integers(0, 2 * B, n)
    prompt_tokens[rng.random(n) < 0.05] = 0
    prompt_blocks[prompt_tokens == 0] = 0
    missing = rng.integers(0, max_missing + 1, n).astype(np.int64)
    return offsets, ids, prompt_blocks, missing, prompt_tokens, max(next_id, 1)


def lru_reference(
    offsets: I64,
    ids: I64,
    prompt_blocks: I64,
    missing: I64,
    prompt_tokens: I64,
    capacity: int,
    replica: I64,
) -> list[int]:
    caches: dict[int, OrderedDict[object, None]] = {}
    out = []
    fresh = 0
    for r in range(prompt_blocks.size):
        cache = caches.setdefault(int(replica[r]), OrderedDict())
        chain = ids[offsets[r] : offsets[r + 1]].tolist()
        h = 0
        for b in chain[: prompt_blocks[r]]:
            if b not in cache:
                break
            h += 1
        out.append(min(h, max(int(prompt_tokens[r]) - 1, 0) // B) * B)
        for _ in range(int(missing[r])):
            fresh += 1
            cache[("fresh", fresh)] = None
        for b in reversed(chain):
            cache[b] = None
            cache.move_to_end(b)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return out


def streams(replica: I64, replicas: int) -> tuple[I64, I64]:
    order = np.argsort(replica, kind="stable").astype(np.int64)
    starts = np.zeros(replicas + 1, np.int64)
    np.cumsum(np.bincount(replica, minlength=replicas), out=starts[1:])
    return order, starts


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("replicas", [1, 3])
def test_chained_replay_matches_an_ordered_dict_lru(seed: int, replicas: int) -> None:
    offsets, ids, pb, missing, ptok, n_ids = random_trie_workload(seed, 150)
    lim = np.minimum(hit_limit_blocks(ptok, B), pb)
    assert kernels.is_chained(offsets, ids, n_ids)
    replica = np.random.default_rng(seed + 100).integers(0, replicas, pb.size).astype(np.int64)
    order, starts = streams(replica, replicas)
    for capacity in [0, 1, 2, 3, 5, 8, 13, 21, 40, 80, 200, 10_000]:
        got = kernels.replay_fixed_chained(
            offsets, ids, pb, missing, lim, B, n_ids, capacity, order, starts
        )
        want = lru_reference(offsets, ids, pb, missing, ptok, capacity, replica)
        assert got.tolist() == want, capacity
        interleaved = kernels.replay_fixed_chained_interleaved(
            offsets, ids, pb, missing, lim, B, n_ids, capacity, replica, order, starts
        )
        assert interleaved.tolist() == want, capacity
        # the block-level kernel with full membership tests agrees too
        block_level = kernels.replay_fixed(
            offsets,
            ids,
            pb,
            missing,
            lim,
            B,
            n_ids,
            capacity,
            4 * ids.size + 64,
            order,
            starts,
            False,
        )
        assert got.tolist() == block_level.tolist(), capacity


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_chained_depth_histogram_equals_block_level_histogram(seed: int, replicas: int) -> None:
    offsets, ids, pb, missing, ptok, n_ids = random_trie_workload(seed, 400, max_missing=2)
    lim = np.minimum(hit_limit_blocks(ptok, B), pb)
    replica = np.random.default_rng(seed).integers(0, replicas, pb.size).astype(np.int64)
    order, starts = streams(replica, replicas)
    size = int(ids.size + missing.sum()) + 2
    fast = kernels.stack_depth_histogram_chained(
        offsets, ids, pb, missing, lim, B, n_ids, order, starts, size
    )
    slow = kernels.stack_depth_histogram_exact(
        offsets, ids, pb, missing, lim, B, n_ids, order, starts, size
    )
    assert fast.tolist() == slow.tolist()
    # and the histogram is the hit count of the direct replay at every capacity
    cumulative = np.cumsum(fast)
    for capacity in range(0, int(np.flatnonzero(fast).max(initial=0)) + 3):
        direct = kernels.replay_fixed_chained(
            offsets, ids, pb, missing, lim, B, n_ids, capacity, order, starts
        )
        assert int(direct.sum()) == int(cumulative[min(capacity, cumulative.size - 1)])


def test_long_gaps_use_the_fenwick_tree() -> None:
    # Many requests between two visits of a prefix: deep runs, many Fenwick levels.
    offsets, ids, pb, missing, ptok, n_ids = random_trie_workload(7, 3000, max_new=2)
    lim = np.minimum(hit_limit_blocks(ptok, B), pb)
    order = np.arange(pb.size, dtype=np.int64)
    starts = np.array([0, pb.size], np.int64)
    size = int(ids.size + missing.sum()) + 2
    fast = kernels.stack_depth_histogram_chained(
        offsets, ids, pb, missing, lim, B, n_ids, order, starts, size
    )
    slow = kernels.stack_depth_histogram_exact(
        offsets, ids, pb, missing, lim, B, n_ids, order, starts, size
    )
    assert fast.tolist() == slow.tolist()
    assert int(np.flatnonzero(fast).max()) > 1000


def test_group_by_replica_is_a_stable_sort() -> None:
    replica = np.random.default_rng(3).integers(0, 5, 1000).astype(np.int64)
    order, starts = kernels.group_by_replica(replica, 6)
    assert order.tolist() == np.argsort(replica, kind="stable").tolist()
    assert starts.tolist() == [0, *np.cumsum(np.bincount(replica, minlength=6)).tolist()]


def test_replica_outside_the_range_is_refused() -> None:
    from pipeline.sim import SimulationInputError
    from pipeline.sim.replay import replica_streams

    with pytest.raises(SimulationInputError, match="replica index"):
        replica_streams(np.array([0, 2, 1], np.int64), 2)
