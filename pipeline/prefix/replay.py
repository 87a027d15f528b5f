"""The unbounded prefix-cache replay behind :func:`pipeline.prefix.compute.reuse_per_request`.

One pass over the requests in arrival order with an open-addressing hash table (numba) from
block hash to the most recent row that held it. The same-tenant part replays each tenant's
requests alone (rows grouped by tenant, arrival order within), clearing the table between
tenants, so memory stays one table of distinct blocks.

A vectorised version (explode every block, stable sort by hash, previous holder = previous
row) gives the same answer, but on a generated trace of 200k requests / 28M blocks its polars
sort of the highly repetitive hashes alone took 84 s and it needs ~40 bytes per block; this
pass is linear in the blocks and needs 32-64 bytes per distinct block (``pipeline.hashmap``,
load ≤ 1/2).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from pipeline.hashmap import EMPTY, find_slot, new_map, put

_MIN_CAPACITY = 1 << 12


@numba.njit(cache=True)  # type: ignore[misc]
def replay_unbounded(
    offsets: npt.NDArray[np.int64],
    values: npt.NDArray[np.uint64],
    prompt_blocks: npt.NDArray[np.int64],
    known: npt.NDArray[np.bool_],
    arrival_us: npt.NDArray[np.int64],
    order: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64],
    buckets_us: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Replay rows in ``order``; the cache is emptied whenever ``group`` (aligned with
    ``order``) changes. Per row: leading prompt blocks an earlier row of the group held
    (``hit``), the age in µs of the deepest one's last holder (-1 without a hit), and the
    leading blocks whose last holder is at most ``buckets_us[b]`` old (``within[:, b]``).
    After its lookup every block of the row (prompt and output) records the row as latest."""
    n = offsets.shape[0] - 1
    n_buckets = buckets_us.shape[0]
    hit = np.zeros(n, dtype=np.int64)
    age = np.full(n, -1, dtype=np.int64)
    within = np.zeros((n, n_buckets), dtype=np.int64)
    keys, rows = new_map(_MIN_CAPACITY)
    used = 0
    open_bucket = np.zeros(n_buckets, dtype=np.bool_)
    longest = 0
    for r in range(n):
        longest = max(longest, prompt_blocks[r])
    found = np.zeros(longest + 1, dtype=np.int64)
    for step in range(order.shape[0]):
        r = order[step]
        if step > 0 and group[step] != group[step - 1] and used > 0:
            keys, rows = new_map(_MIN_CAPACITY)
            used = 0
        if not known[r]:
            continue
        start = offsets[r]
        length = offsets[r + 1] - start
        pb = min(prompt_blocks[r], length)
        for b in range(n_buckets):
            open_bucket[b] = True
        k = 0
        while k < pb:
            i = find_slot(keys, rows, values[start + k])
            if rows[i] == EMPTY:
                break
            found[k] = i
            a = arrival_us[r] - arrival_us[rows[i]]
            age[r] = a
            for b in range(n_buckets):
                if open_bucket[b] and a <= buckets_us[b]:
                    within[r, b] += 1
                else:
                    open_bucket[b] = False
            k += 1
        hit[r] = k
        # The hit blocks' slots are known (no insert happened since the lookup): refresh them
        # without probing again; then insert or refresh the rest of the chain.
        for j in range(k):
            rows[found[j]] = r
        for k in range(hit[r], length):
            keys, rows, used = put(keys, rows, used, values[start + k], r)
    return hit, age, within
