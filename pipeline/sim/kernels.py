"""Compiled (numba) hot loops of the replay. Every function here works on flat integer arrays.

A workload arrives as CSR-style arrays: request ``r`` owns block ids ``ids[offsets[r]:offsets[r+1]]``
(dense ids 0..n_ids-1 of its chained hashes, prompt blocks first), the first
``prompt_blocks[r]`` of which are prompt blocks, plus ``missing[r]`` output blocks whose
tokens are unknown: they occupy capacity as blocks that never match (DOMAIN.md).

Cache rules implemented (vLLM APC, SIM_ANCHORS.md section 1):
- lookup walks the prompt's chain from block 0 and stops at the first miss;
  hit tokens = min(hit blocks × B, prompt tokens − 1), never negative;
- after serving, every block of prompt + output is inserted or refreshed tail first (the
  unknown output blocks, being the tail, first of all), so block 0 ends most recent;
- then least-recently-used blocks are evicted until at most ``capacity`` blocks remain.

The exact LRU uses a per-replica append-only queue with lazy deletion: ``stamp[id]`` is the
queue position of the block's latest entry (-1 when not cached), an entry is live iff the stamp
still points at it, and eviction pops the queue head skipping dead entries. The queue is
compacted in place when full; it is sized so compaction is amortised O(1) per access.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_BUCKET_SHIFT = 9  # Fenwick leaves are buckets of 512 positions = 8 bit-words (one cache line)


@nb.njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


# ---------------------------------------------------------------------------------------------
# Ingest helpers: dense ids and stable string hashes
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _dense_map_chunk(
    keys: NDArray[np.uint64],
    start: int,
    out: I64,
    table_keys: NDArray[np.uint64],
    table_vals: I64,
    n_distinct: int,
) -> tuple[int, int]:
    mask = np.uint64(table_keys.size - 1)
    limit = table_keys.size // 2
    for i in range(start, keys.size):
        k = keys[i]
        slot = splitmix64(k) & mask
        while True:
            v = table_vals[slot]
            if v < 0:
                if n_distinct >= limit:
                    return i, n_distinct
                table_keys[slot] = k
                table_vals[slot] = n_distinct
                out[i] = n_distinct
                n_distinct += 1
                break
            if table_keys[slot] == k:
                out[i] = v
                break
            slot = (slot + _ONE) & mask
    return keys.size, n_distinct


@nb.njit(cache=True)
def _rehash(
    old_keys: NDArray[np.uint64],
    old_vals: I64,
    new_keys: NDArray[np.uint64],
    new_vals: I64,
) -> None:
    mask = np.uint64(new_keys.size - 1)
    for s in range(old_keys.size):
        v = old_vals[s]
        if v < 0:
            continue
        k = old_keys[s]
        slot = splitmix64(k) & mask
        while new_vals[slot] >= 0:
            slot = (slot + _ONE) & mask
        new_keys[slot] = k
        new_vals[slot] = v


def dense_ids(keys: NDArray[np.uint64]) -> tuple[I64, int]:
    """Map 64-bit keys to dense ids 0..n-1 in order of first appearance (open addressing)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    out = np.empty(keys.size, np.int64)
    size = 1 << max(10, (2 * min(keys.size, 1 << 22)).bit_length())
    table_keys = np.zeros(size, np.uint64)
    table_vals = np.full(size, -1, np.int64)
    pos, n_distinct = 0, 0
    while True:
        pos, n_distinct = _dense_map_chunk(keys, pos, out, table_keys, table_vals, n_distinct)
        if pos >= keys.size:
            return out, n_distinct
        new_keys = np.zeros(size * 4, np.uint64)
        new_vals = np.full(size * 4, -1, np.int64)
        _rehash(table_keys, table_vals, new_keys, new_vals)
        size *= 4
        table_keys, table_vals = new_keys, new_vals


@nb.njit(cache=True)
def fnv1a_strings(offsets: I64, data: NDArray[np.uint8]) -> NDArray[np.uint64]:
    """FNV-1a 64 of each string (bytes ``data[offsets[i]:offsets[i+1]]``), then SplitMix64."""
    n = offsets.size - 1
    out = np.empty(n, np.uint64)
    for i in range(n):
        h = _FNV_OFFSET
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        out[i] = splitmix64(h)
    return out


# ---------------------------------------------------------------------------------------------
# Routing that does not depend on cache state
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _heap_push(ht: I64, hr: I64, n: int, t: int, r: int) -> int:
    i = n
    ht[i] = t
    hr[i] = r
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] <= ht[i]:
            break
        ht[p], ht[i] = ht[i], ht[p]
        hr[p], hr[i] = hr[i], hr[p]
        i = p
    return n + 1


@nb.njit(cache=True, inline="always")
def _heap_pop(ht: I64, hr: I64, n: int) -> int:
    n -= 1
    ht[0] = ht[n]
    hr[0] = hr[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and ht[c + 1] < ht[c]:
            c += 1
        if ht[i] <= ht[c]:
            break
        ht[c], ht[i] = ht[i], ht[c]
        hr[c], hr[i] = hr[i], hr[c]
        i = c
    return n


@nb.njit(cache=True, inline="always")
def _argmin(values: I64) -> int:
    best = 0
    for k in range(1, values.size):
        if values[k] < values[best]:
            best = k
    return best


@nb.njit(cache=True)
def least_loaded(arrival: I64, duration: I64, replicas: int) -> I64:
    """Each request goes to the replica with the fewest requests in flight at its arrival.

    A request is in flight on ``[arrival, arrival + duration)``; ties go to the lowest index.
    """
    n = arrival.size
    out = np.empty(n, np.int64)
    load = np.zeros(replicas, np.int64)
    ht = np.empty(n, np.int64)
    hr = np.empty(n, np.int64)
    hn = 0
    for r in range(n):
        t = arrival[r]
        while hn > 0 and ht[0] <= t:
            load[hr[0]] -= 1
            hn = _heap_pop(ht, hr, hn)
        k = _argmin(load)
        out[r] = k
        load[k] += 1
        hn = _heap_push(ht, hr, hn, t + duration[r], k)
    return out


@nb.njit(cache=True)
def least_served(tokens: I64, replicas: int) -> I64:
    """Each request goes to the replica that has served the fewest tokens so far (ties: lowest)."""
    n = tokens.size
    out = np.empty(n, np.int64)
    served = np.zeros(replicas, np.int64)
    for r in range(n):
        k = _argmin(served)
        out[r] = k
        served[k] += tokens[r]
    return out


@nb.njit(cache=True)
def bounded_affinity(home: I64, replicas: int, margin: float) -> tuple[I64, int]:
    """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018).

    Request ``i`` (0-based) stays on its home replica unless that would take the home's count
    of served requests above ``ceil((1 + margin) × (i + 1) / R)``; then it spills to the replica
    that has served the fewest requests (ties: lowest index).
    """
    n = home.size
    out = np.empty(n, np.int64)
    served = np.zeros(replicas, np.int64)
    spills = 0
    for i in range(n):
        k = home[i]
        bound = np.ceil((1.0 + margin) * (i + 1) / replicas - 1e-9)
        if served[k] + 1 > bound:
            k = _argmin(served)
            spills += 1
        out[i] = k
        served[k] += 1
    return out, spills


# ---------------------------------------------------------------------------------------------
# Fixed-capacity replay (and the cache-aware router, which reads cache state)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _compact(buf: I64, stamp: I64, qb: int, base: int, head: int, tail: int) -> int:
    w = 0
    for pos in range(head, tail):
        e = buf[qb + pos]
        if e < 0:
            buf[qb + w] = -1
            w += 1
        elif stamp[base + e] == pos:
            buf[qb + w] = e
            stamp[base + e] = w
            w += 1
    return w


@nb.njit(cache=True)
def replay(
    offsets: I64,
    ids: I64,
    prompt_blocks: I64,
    missing: I64,
    prompt_tokens: I64,
    block_size: int,
    n_ids: int,
    replicas: int,
    capacity: int,
    queue_size: int,
    assign: I64,
    cache_aware: bool,
    arrival: I64,
    duration: I64,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
) -> tuple[I64, I64, int]:
    """Replay requests in order through ``replicas`` LRU caches of ``capacity`` blocks each.

    With ``cache_aware`` False request ``r`` goes to ``assign[r]``. With it True the sgl-router
    ``cache_aware`` policy decides (sglang-router 0.3.2 ``src/policies/cache_aware.rs``
    ``select_worker`` L351-461, SIM_ANCHORS.md section 2): load = requests in flight at arrival
    (the router's in-flight count); if ``max - min > balance_abs`` and ``max > min × balance_rel``
    the request goes to the least loaded replica; otherwise match rate = matched prompt tokens /
    prompt tokens of the best replica, and above ``cache_threshold`` the request goes there,
    else to the least loaded. The router's view of each replica's prefixes is that replica's own
    cache (as with KV events), not the approximate character tree; a tie in match length goes to
    the lower load, then the lower index (smg's event-driven mode).

    Returns per-request hit tokens, the replica each request met, and how many requests the
    imbalance rule routed.
    """
    n = prompt_blocks.size
    stamp = np.full(replicas * n_ids, -1, np.int64)
    buf = np.empty(replicas * queue_size, np.int64)
    head = np.zeros(replicas, np.int64)
    tail = np.zeros(replicas, np.int64)
    count = np.zeros(replicas, np.int64)
    hits = np.zeros(n, np.int64)
    chosen = np.empty(n, np.int64)
    load = np.zeros(replicas, np.int64)
    matched = np.zeros(replicas, np.int64)
    hn = 0
    heap_len = n if cache_aware else 1
    ht = np.empty(heap_len, np.int64)
    hr = np.empty(heap_len, np.int64)
    balance_routed = 0
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        pb = prompt_blocks[r]
        if cache_aware:
            t = arrival[r]
            while hn > 0 and ht[0] <= t:
                load[hr[0]] -= 1
                hn = _heap_pop(ht, hr, hn)
            mn = load[0]
            mx = load[0]
            for q in range(1, replicas):
                mn = min(mn, load[q])
                mx = max(mx, load[q])
            if mx - mn > balance_abs and mx > mn * balance_rel:
                k = _argmin(load)
                balance_routed += 1
            else:
                best = 0
                for q in range(replicas):
                    qbase = q * n_ids
                    h = 0
                    while h < pb and stamp[qbase + ids[lo + h]] >= 0:
                        h += 1
                    matched[q] = h
                    if h > matched[best] or (h == matched[best] and load[q] < load[best]):
                        best = q
                rate = 0.0
                if prompt_tokens[r] > 0:
                    rate = matched[best] * block_size / prompt_tokens[r]
                k = best if rate > cache_threshold else _argmin(load)
            load[k] += 1
            hn = _heap_push(ht, hr, hn, t + duration[r], k)
        else:
            k = assign[r]
        chosen[r] = k
        base = k * n_ids
        qb = k * queue_size
        h = 0
        while h < pb and stamp[base + ids[lo + h]] >= 0:
            h += 1
        hit = min(h * block_size, prompt_tokens[r] - 1)
        hits[r] = max(hit, 0)
        need = missing[r] + (hi - lo)
        if tail[k] + need > queue_size:
            tail[k] = _compact(buf, stamp, qb, base, head[k], tail[k])
            head[k] = 0
        tk = tail[k]
        ck = count[k]
        for _ in range(missing[r]):
            buf[qb + tk] = -1
            tk += 1
            ck += 1
        for j in range(hi - 1, lo - 1, -1):
            b = ids[j]
            if stamp[base + b] < 0:
                ck += 1
            stamp[base + b] = tk
            buf[qb + tk] = b
            tk += 1
        hd = head[k]
        while ck > capacity:
            e = buf[qb + hd]
            if e < 0:
                ck -= 1
            elif stamp[base + e] == hd:
                stamp[base + e] = -1
                ck -= 1
            hd += 1
        head[k] = hd
        tail[k] = tk
        count[k] = ck
    return hits, chosen, balance_routed


# ---------------------------------------------------------------------------------------------
# One pass for every capacity: LRU stack distances (Bennett & Kruskal 1975)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _popcount(x: np.uint64) -> int:
    x = x - ((x >> _ONE) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return int((x * _H01) >> np.uint64(56))


@nb.njit(cache=True, inline="always")
def _tree_add(tree: I64, bucket: int, delta: int) -> None:
    i = bucket + 1
    while i < tree.size:
        tree[i] += delta
        i += i & -i


@nb.njit(cache=True, inline="always")
def _marks_upto(tree: I64, bits: NDArray[np.uint64], p: int) -> int:
    """Number of marked positions in ``[0, p]``."""
    bucket = p >> _BUCKET_SHIFT
    s = 0
    i = bucket
    while i > 0:
        s += tree[i]
        i -= i & -i
    w = p >> 6
    for q in range(bucket << (_BUCKET_SHIFT - 6), w):
        s += _popcount(bits[q])
    bit = p & 63
    mask = _ALL if bit == 63 else (_ONE << np.uint64(bit + 1)) - _ONE
    return s + _popcount(bits[w] & mask)


@nb.njit(cache=True)
def stack_depth_histogram(
    offsets: I64,
    ids: I64,
    prompt_blocks: I64,
    missing: I64,
    prompt_tokens: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    sample_threshold: np.uint64,
    sample_salt: np.uint64,
    hist_size: int,
) -> NDArray[np.float64]:
    """Token-weighted histogram of LRU stack depths at lookup, for the requests ``order``.

    ``order`` lists the requests one cache sees, in arrival order. Accesses are the blocks each
    request inserts or refreshes, tail first (so every parent is more recent than its children
    and a capacity-C cache, which holds exactly the C most recent distinct blocks, is
    prefix-closed). At lookup, prompt block ``j`` is cached in a C-block cache iff its depth
    (1 + distinct blocks accessed since its last access) is ≤ C; it then adds
    ``min((j+1)B, P-1) - min(jB, P-1)`` hit tokens. ``hist[d]`` sums those tokens, so the hit
    tokens at capacity C are ``hist[:C+1].sum()``.

    Depths come from a Fenwick tree over access positions marking each block's latest access
    (Bennett & Kruskal 1975); its leaves are 512-position buckets of a bitmap, so the tree stays
    small and the last level is a popcount. With ``sample_threshold`` below 2^64-1 only blocks
    whose salted hash falls under it are tracked and depths and weights are scaled by the rate
    (SHARDS, Waldspurger et al., FAST 2015); histogram index = round(depth / rate).
    """
    total = 0
    for i in range(order.size):
        r = order[i]
        total += missing[r] + offsets[r + 1] - offsets[r]
    bits = np.zeros((total >> 6) + 2, np.uint64)
    tree = np.zeros((total >> _BUCKET_SHIFT) + 2, np.int64)
    last = np.full(n_ids, -1, np.int64)
    hist = np.zeros(hist_size, np.float64)
    sampling = sample_threshold != _ALL
    rate = (float(sample_threshold) + 1.0) / 18446744073709551616.0
    scale = 1.0 / rate if sampling else 1.0
    t = 0
    marks = 0
    anon = np.uint64(0)
    for i in range(order.size):
        r = order[i]
        lo = offsets[r]
        hi = offsets[r + 1]
        pb = prompt_blocks[r]
        cap_tok = prompt_tokens[r] - 1
        for j in range(pb):
            b = ids[lo + j]
            if sampling and (splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold):
                continue
            p = last[b]
            if p < 0:
                if sampling:
                    continue
                break
            depth = marks - _marks_upto(tree, bits, p) + 1
            w_hi = min((j + 1) * block_size, cap_tok)
            w_lo = min(j * block_size, cap_tok)
            w = max(w_hi, 0) - max(w_lo, 0)
            if w <= 0:
                continue
            idx = int(depth * scale + 0.5) if sampling else depth
            if idx >= hist_size:
                idx = hist_size - 1
            hist[idx] += w * scale
        for _ in range(missing[r]):
            anon += _ONE
            if sampling and (splitmix64(anon ^ ~sample_salt) > sample_threshold):
                continue
            bits[t >> 6] |= _ONE << np.uint64(t & 63)
            _tree_add(tree, t >> _BUCKET_SHIFT, 1)
            marks += 1
            t += 1
        for j in range(hi - 1, lo - 1, -1):
            b = ids[j]
            if sampling and (splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold):
                continue
            p = last[b]
            if p >= 0:
                bits[p >> 6] &= ~(_ONE << np.uint64(p & 63))
                _tree_add(tree, p >> _BUCKET_SHIFT, -1)
                marks -= 1
            bits[t >> 6] |= _ONE << np.uint64(t & 63)
            _tree_add(tree, t >> _BUCKET_SHIFT, 1)
            marks += 1
            last[b] = t
            t += 1
    return hist
