"""Compiled (numba) hot loops of the replay. Every function here works on flat integer arrays.

A workload arrives as CSR-style arrays: request ``r`` owns block ids ``ids[offsets[r]:offsets[r+1]]``
(dense ids 0..n_ids-1 of its chained hashes, prompt blocks first), the first
``prompt_blocks[r]`` of which are prompt blocks, plus ``missing[r]`` output blocks whose
tokens are unknown: they occupy capacity as blocks that never match (DOMAIN.md).

Cache rules implemented (vLLM APC, SIM_ANCHORS.md section 1):
- lookup walks the prompt's chain from block 0 and stops at the first miss;
  hit tokens = min(hit blocks, hit limit) × B with the limit ⌊(P − 1) / B⌋ precomputed by
  ``pipeline.cache_rules.hit_limit_blocks``;
- after serving, every block of prompt + output is inserted or refreshed tail first (the
  unknown output blocks, being the tail, first of all), so block 0 ends most recent;
- then least-recently-used blocks are evicted until at most ``capacity`` blocks remain.

The exact LRU uses a per-replica append-only queue with lazy deletion: ``stamp[id]`` is the
queue position of the block's latest entry (-1 when not cached), an entry is live iff the stamp
still points at it, and eviction pops the queue head skipping dead entries. The queue is
compacted in place when full; it is sized so compaction is amortised O(1) per access.
Unknown output blocks enter the queue as one run entry per request. That block-level queue
serves ids that do not form proper chains and the cache-aware router.

When the ids form proper hash chains (``is_chained``) the cache is prefix-closed and the LRU is
kept at request granularity instead (``replay_fixed_chained``: one queue entry per request,
O(1) eviction per entry, one pass over each chain), and the all-capacity curve uses the same
entries (``hit_steps_chained``: one Fenwick query per run of blocks last touched by the same
request, instead of per block).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

from pipeline.hashmap import splitmix64

I64 = NDArray[np.int64]

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_BUCKET_SHIFT = 9  # Fenwick leaves are buckets of 512 positions = 8 bit-words (one cache line)


# ---------------------------------------------------------------------------------------------
# Ingest helpers: chain structure and stable string hashes
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def is_chained(offsets: I64, ids: Any, n_ids: int) -> bool:
    """True when every block id always follows the same parent at the same position.

    That is the chained-hash structure (a block key identifies its whole prefix); it makes
    every LRU cache prefix-closed, which the fast replay path and the one-pass curve rely on.
    """
    parent = np.full(n_ids, -2, np.int64)
    position = np.full(n_ids, -1, np.int64)
    for r in range(offsets.size - 1):
        prev = -1
        for j in range(offsets[r], offsets[r + 1]):
            b = ids[j]
            pos = j - offsets[r]
            if parent[b] == -2:
                parent[b] = prev
                position[b] = pos
            elif parent[b] != prev or position[b] != pos:
                return False
            prev = b
    return True


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
# Queue entries: a block id (>= 0), or -m for a run of m unknown output blocks (always live,
# never refreshed, evicted from the front of the run). stamp[id] = queue position of the
# block's latest entry, -1 when not cached.


@nb.njit(cache=True)
def _compact(buf: Any, stamp: Any, head: int, tail: int) -> int:
    w = 0
    for pos in range(head, tail):
        e = buf[pos]
        if e < 0:
            buf[w] = e
            w += 1
        elif stamp[e] == pos:
            buf[w] = e
            stamp[e] = w
            w += 1
    return w


@nb.njit(cache=True, inline="always")
def _lookup(stamp: Any, ids: Any, lo: int, pb: int) -> int:
    h = 0
    while h < pb and stamp[ids[lo + h]] >= 0:
        h += 1
    return h


@nb.njit(cache=True, inline="always")
def _serve(
    stamp: Any,
    buf: Any,
    ids: Any,
    lo: int,
    hi: int,
    missing: int,
    capacity: int,
    state: Any,
) -> None:
    """Insert/refresh tail first, then evict LRU down to capacity. state = [head, tail, count]."""
    head = state[0]
    tail = state[1]
    count = state[2]
    if tail + 1 + (hi - lo) > buf.size:
        tail = _compact(buf, stamp, head, tail)
        head = 0
    if missing > 0:
        buf[tail] = -missing
        tail += 1
        count += missing
    for j in range(hi - 1, lo - 1, -1):
        b = ids[j]
        if stamp[b] < 0:
            count += 1
        stamp[b] = tail
        buf[tail] = b
        tail += 1
    while count > capacity:
        e = buf[head]
        if e < 0:
            run = -e
            excess = count - capacity
            if run <= excess:
                count -= run
                head += 1
            else:
                buf[head] = -(run - excess)
                count -= excess
        else:
            if stamp[e] == head:
                stamp[e] = -1
                count -= 1
            head += 1
    state[0] = head
    state[1] = tail
    state[2] = count


@nb.njit(cache=True, inline="always")
def _serve_chained(
    stamp: Any,
    buf: Any,
    ids: Any,
    lo: int,
    hi: int,
    cached: int,
    missing: int,
    capacity: int,
    state: Any,
) -> None:
    """``_serve`` for proper chains, whose first ``cached`` blocks are cached and the rest not.

    In a chain every block has one parent and tail-first refresh keeps parents more recent
    than children, so the cache is prefix-closed: past the first miss nothing is cached and
    the new blocks need no membership test.
    """
    head = state[0]
    tail = state[1]
    count = state[2]
    if tail + 1 + (hi - lo) > buf.size:
        tail = _compact(buf, stamp, head, tail)
        head = 0
    if missing > 0:
        buf[tail] = -missing
        tail += 1
        count += missing
    count += hi - lo - cached
    for j in range(hi - 1, lo - 1, -1):
        b = ids[j]
        stamp[b] = tail
        buf[tail] = b
        tail += 1
    while count > capacity:
        e = buf[head]
        if e < 0:
            run = -e
            excess = count - capacity
            if run <= excess:
                count -= run
                head += 1
            else:
                buf[head] = -(run - excess)
                count -= excess
        else:
            if stamp[e] == head:
                stamp[e] = -1
                count -= 1
            head += 1
    state[0] = head
    state[1] = tail
    state[2] = count


@nb.njit(cache=True)
def _replay_stream(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    capacity: int,
    queue_size: int,
    order: I64,
    hits: I64,
    chained: bool,
) -> None:
    stamp = np.full(n_ids, -1, np.int32)
    buf = np.empty(queue_size, np.int32)
    state = np.zeros(3, np.int64)
    for i in range(order.size):
        r = order[i]
        lo = offsets[r]
        hi = offsets[r + 1]
        if chained:
            cached = _lookup(stamp, ids, lo, hi - lo)
            h = min(cached, prompt_blocks[r])
            hits[r] = min(h, hit_limit[r]) * block_size
            _serve_chained(stamp, buf, ids, lo, hi, cached, missing[r], capacity, state)
        else:
            h = _lookup(stamp, ids, lo, prompt_blocks[r])
            hits[r] = min(h, hit_limit[r]) * block_size
            _serve(stamp, buf, ids, lo, hi, missing[r], capacity, state)


@nb.njit(cache=True)
def replay_fixed(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    capacity: int,
    queue_size: int,
    order: I64,
    starts: I64,
    chained: bool,
) -> I64:
    """Replay with a fixed assignment: replica k serves ``order[starts[k]:starts[k+1]]``.

    Replicas are independent caches, replayed one after another (a numba ``prange`` over
    replicas measured slower on 2 cores than this serial loop).
    """
    hits = np.zeros(prompt_blocks.size, np.int64)
    for k in range(starts.size - 1):
        _replay_stream(
            offsets,
            ids,
            prompt_blocks,
            missing,
            hit_limit,
            block_size,
            n_ids,
            capacity,
            queue_size,
            order[starts[k] : starts[k + 1]],
            hits,
            chained,
        )
    return hits


@nb.njit(cache=True)
def replay_cache_aware(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    prompt_tokens: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    replicas: int,
    capacity: int,
    queue_size: int,
    arrival: I64,
    duration: I64,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
) -> tuple[I64, I64, int]:
    """Replay under the sgl-router ``cache_aware`` policy, which reads the caches.

    sglang-router 0.3.2 ``src/policies/cache_aware.rs`` ``select_worker`` L351-461
    (SIM_ANCHORS.md section 2): load = requests in flight at arrival (the router's in-flight
    count); if ``max - min > balance_abs`` and ``max > min × balance_rel`` the request goes to
    the least loaded replica; otherwise match rate = matched prompt tokens / prompt tokens on
    the best replica, and above ``cache_threshold`` the request goes there, else to the least
    loaded. The router's view of each replica's prefixes is that replica's own cache (as with
    KV events) rather than the approximate character tree; a tie in match length goes to the
    lower load, then the lower index (smg's event-driven mode).

    Returns per-request hit tokens, the replica each request met, and how many requests the
    imbalance rule routed.
    """
    n = prompt_blocks.size
    stamp = np.full((replicas, n_ids), -1, np.int32)
    buf = np.empty((replicas, queue_size), np.int32)
    state = np.zeros((replicas, 3), np.int64)
    hits = np.zeros(n, np.int64)
    chosen = np.empty(n, np.int64)
    load = np.zeros(replicas, np.int64)
    matched = np.zeros(replicas, np.int64)
    hn = 0
    ht = np.empty(n, np.int64)
    hr = np.empty(n, np.int64)
    balance_routed = 0
    for r in range(n):
        lo = offsets[r]
        pb = prompt_blocks[r]
        t = arrival[r]
        while hn > 0 and ht[0] <= t:
            load[hr[0]] -= 1
            hn = _heap_pop(ht, hr, hn)
        mn = load.min()
        mx = load.max()
        if mx - mn > balance_abs and mx > mn * balance_rel:
            k = _argmin(load)
            balance_routed += 1
        else:
            best = 0
            for q in range(replicas):
                matched[q] = _lookup(stamp[q], ids, lo, pb)
                if matched[q] > matched[best] or (
                    matched[q] == matched[best] and load[q] < load[best]
                ):
                    best = q
            rate = 0.0
            if prompt_tokens[r] > 0:
                rate = matched[best] * block_size / prompt_tokens[r]
            k = best if rate > cache_threshold else _argmin(load)
        load[k] += 1
        hn = _heap_push(ht, hr, hn, t + duration[r], k)
        chosen[r] = k
        h = _lookup(stamp[k], ids, lo, pb)
        hits[r] = min(h, hit_limit[r]) * block_size
        _serve(stamp[k], buf[k], ids, lo, offsets[r + 1], missing[r], capacity, state[k])
    return hits, chosen, balance_routed


# ---------------------------------------------------------------------------------------------
# One pass for every capacity: LRU stack distances (Bennett & Kruskal 1975)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _popcount(x: np.uint64) -> int:
    x = x - ((x >> _ONE) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))  # type: ignore[return-value]  # numba int64


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


@nb.njit(cache=True, inline="always")
def _marks_after(bits: NDArray[np.uint64], p: int, t: int) -> int:
    """Number of marked positions in ``(p, t)``; positions ≥ t are never marked yet."""
    w = p >> 6
    bit = p & 63
    s = 0
    if bit != 63:
        s = _popcount(bits[w] & ~((_ONE << np.uint64(bit + 1)) - _ONE))
    for q in range(w + 1, ((t - 1) >> 6) + 1):
        s += _popcount(bits[q])
    return s


@nb.njit(cache=True, inline="always")
def _set_range(bits: NDArray[np.uint64], a: int, b: int) -> int:
    """Mark positions ``[a, b)`` word by word; returns ``b``."""
    while a < b:
        off = a & 63
        n = min(64 - off, b - a)
        mask = _ALL if n == 64 else ((_ONE << np.uint64(n)) - _ONE) << np.uint64(off)
        bits[a >> 6] |= mask
        a += n
    return b


_NEAR = 1024  # positions within this distance of the end are counted on the bitmap directly


@nb.njit(cache=True)
def _depth_stream(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    sample_threshold: np.uint64,
    sample_salt: np.uint64,
    hist: NDArray[np.float64],
) -> None:
    total = 0
    for i in range(order.size):
        r = order[i]
        total += missing[r] + offsets[r + 1] - offsets[r]
    bits = np.zeros((total >> 6) + 2, np.uint64)
    tree = np.zeros((total >> _BUCKET_SHIFT) + 2, np.int64)
    last = np.full(n_ids, -1, np.int32)  # positions < 2^31 (checked by the caller)
    hist_size = hist.size
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
        prev_p = -2
        depth = 0
        w = block_size  # every block below the hit limit weighs a whole block
        for j in range(hit_limit[r]):
            b = ids[lo + j]
            if sampling and (splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold):
                continue
            hist[0] += w * scale  # sampled lookup weight, for the ratio estimator
            p = last[b]
            if p < 0:
                if sampling:
                    continue
                break
            if prev_p - p == 1:
                depth += 1  # adjacent positions: no mark between, one deeper (common case)
            elif t - p <= _NEAR:
                depth = _marks_after(bits, p, t) + 1
            else:
                depth = marks - _marks_upto(tree, bits, p) + 1
            prev_p = p
            idx = int(depth * scale + 0.5) if sampling else depth
            if idx >= hist_size:
                idx = hist_size - 1
            hist[idx] += w * scale
        # accesses, tail first; Fenwick updates are batched per bucket
        t_start = t
        for _ in range(missing[r]):
            anon += _ONE
            if sampling and (splitmix64(anon ^ ~sample_salt) > sample_threshold):
                continue
            bits[t >> 6] |= _ONE << np.uint64(t & 63)
            t += 1
        cur = -1
        acc = 0
        for j in range(hi - 1, lo - 1, -1):
            b = ids[j]
            if sampling and (splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold):
                continue
            p = last[b]
            if p >= 0:
                bits[p >> 6] &= ~(_ONE << np.uint64(p & 63))
                bucket = p >> _BUCKET_SHIFT
                if bucket != cur:
                    if acc != 0:
                        _tree_add(tree, cur, acc)
                    cur = bucket
                    acc = 0
                acc -= 1
                marks -= 1
            bits[t >> 6] |= _ONE << np.uint64(t & 63)
            last[b] = t
            t += 1
        if acc != 0:
            _tree_add(tree, cur, acc)
        # the new marks t_start..t-1 are contiguous: one tree update per bucket they span
        pos = t_start
        while pos < t:
            bucket = pos >> _BUCKET_SHIFT
            end = min(t, (bucket + 1) << _BUCKET_SHIFT)
            _tree_add(tree, bucket, end - pos)
            pos = end
        marks += t - t_start


@nb.njit(cache=True)
def _depth_stream_exact(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    hist: I64,
) -> None:
    """``_depth_stream`` without sampling, for chained ids (integer weights).

    Chains make "seen before" prefix-closed too (a child is never accessed without its
    parent), so one walk finds the seen prefix of the request's chain and keeps its previous
    positions; the rest are new blocks, which need no read of ``last``. A request's accesses
    take the contiguous positions ``t .. t + missing + len - 1`` (unknown output blocks first,
    then the chain tail first), so their marks are set as one range.
    """
    total = 0
    longest = 1
    for i in range(order.size):
        r = order[i]
        total += missing[r] + offsets[r + 1] - offsets[r]
        longest = max(longest, offsets[r + 1] - offsets[r])
    bits = np.zeros((total >> 6) + 2, np.uint64)
    tree = np.zeros((total >> _BUCKET_SHIFT) + 2, np.int64)
    last = np.full(n_ids, -1, np.int32)  # positions < 2^31 (checked by the caller)
    prev_pos = np.empty(longest, np.int64)
    top = hist.size - 1
    t = 0
    marks = 0
    for i in range(order.size):
        r = order[i]
        lo = offsets[r]
        length = offsets[r + 1] - lo
        limit = hit_limit[r]
        prev_p = -2
        depth = 0
        seen = 0
        while seen < length:
            p = last[ids[lo + seen]]
            if p < 0:
                break
            prev_pos[seen] = p
            if prev_p - p == 1:
                depth += 1  # adjacent positions: no mark between, one deeper (common case)
            elif seen < limit:
                if t - p <= _NEAR:
                    depth = _marks_after(bits, p, t) + 1
                else:
                    depth = marks - _marks_upto(tree, bits, p) + 1
            prev_p = p
            if seen < limit:
                hist[min(depth, top)] += block_size
            seen += 1
        # clear the previous marks of the seen blocks (Fenwick updates batched per bucket)
        cur = -1
        acc = 0
        for j in range(seen):
            p = prev_pos[j]
            bits[p >> 6] &= ~(_ONE << np.uint64(p & 63))
            bucket = p >> _BUCKET_SHIFT
            if bucket != cur:
                if acc != 0:
                    _tree_add(tree, cur, acc)
                cur = bucket
                acc = 0
            acc -= 1
        if acc != 0:
            _tree_add(tree, cur, acc)
        # new positions: unknown output blocks, then the chain tail first
        t_start = t
        t_end = t + missing[r] + length
        _set_range(bits, t_start, t_end)
        pos = t_end - 1
        for j in range(length):
            last[ids[lo + j]] = pos - j
        pos = t_start
        while pos < t_end:
            bucket = pos >> _BUCKET_SHIFT
            end = min(t_end, (bucket + 1) << _BUCKET_SHIFT)
            _tree_add(tree, bucket, end - pos)
            pos = end
        marks += t_end - t_start - seen
        t = t_end


@nb.njit(cache=True)
def stack_depth_histogram_exact(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    hist_size: int,
) -> I64:
    """``stack_depth_histogram`` without sampling, for chained ids: integer token weights."""
    hist = np.zeros(hist_size, np.int64)
    for k in range(starts.size - 1):
        _depth_stream_exact(
            offsets,
            ids,
            prompt_blocks,
            missing,
            hit_limit,
            block_size,
            n_ids,
            order[starts[k] : starts[k + 1]],
            hist,
        )
    return hist


@nb.njit(cache=True)
def stack_depth_histogram(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    sample_threshold: np.uint64,
    sample_salt: np.uint64,
    hist_size: int,
) -> NDArray[np.float64]:
    """Token-weighted histogram of LRU stack depths at lookup, summed over replicas.

    Replica k sees requests ``order[starts[k]:starts[k+1]]`` in arrival order. Accesses are
    the blocks each request inserts or refreshes, tail first (so every parent is more recent
    than its children and a capacity-C cache, which holds exactly the C most recent distinct
    blocks, is prefix-closed). At lookup, prompt block ``j`` is cached in a C-block cache iff
    its depth (1 + distinct blocks accessed since its last access) is ≤ C; it then adds B hit
    tokens when ``j < hit_limit[r]``, else none. ``hist[d]`` sums those tokens, so hit
    tokens at capacity C (the same on every replica) are ``hist[:C+1].sum()``.

    Depths come from a Fenwick tree over access positions marking each block's latest access
    (Bennett & Kruskal 1975); its leaves are 512-position buckets of a bitmap, so the tree stays
    small and the last level is a popcount; a recent position is counted on the bitmap alone.
    A block whose previous access sits right before its predecessor's is one deeper than it,
    without a query. With ``sample_threshold`` below 2^64-1 only blocks whose salted hash falls
    under it are tracked and depths and weights are scaled by the rate (SHARDS, Waldspurger et
    al., FAST 2015).
    """
    hist = np.zeros(hist_size, np.float64)
    for k in range(starts.size - 1):
        _depth_stream(
            offsets,
            ids,
            prompt_blocks,
            missing,
            hit_limit,
            block_size,
            n_ids,
            order[starts[k] : starts[k + 1]],
            sample_threshold,
            sample_salt,
            hist,
        )
    return hist


# ---------------------------------------------------------------------------------------------
# Chained ids: the LRU kept at request granularity
# ---------------------------------------------------------------------------------------------
# With proper chains (kernels.is_chained) and tail-first refresh, request i's accesses form one
# queue entry: its unknown output blocks, then its chain from the last block to block 0. A block
# belongs to the entry of the last request that touched it (stamp[id] = that request's index in
# the stream). A later request that refreshes block j also refreshes every ancestor, so the
# blocks an entry still owns are a suffix j >= k of its chain positions, and eviction, which
# pops the entry tail first (unknown output blocks, then the highest positions), takes exactly
# the highest owned positions. So each entry needs only its owned-block count ``live[e]``; the
# oldest entry additionally tracks how many unknown output blocks it has left and ``top``, the
# positions below which its owned blocks are still cached. A block is cached iff its stamp is a
# later entry than the oldest, or the oldest entry with position < top. Lookup and refresh are
# one pass over the chain; eviction is O(1) per entry and never reads block ids.


@nb.njit(cache=True, boundscheck=False)
def _replay_chained_stream(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    capacity: int,
    order: I64,
    first: int,
    stamp: Any,
    live: Any,
    hits: I64,
) -> None:
    """Replay stream entries ``first .. first + order.size - 1`` (global stamps, no reset)."""
    n = order.size
    if n == 0:
        return
    head = first  # oldest entry that may own cached blocks
    r0 = order[0]
    miss_left = missing[r0]
    top = offsets[r0 + 1] - offsets[r0]
    count = 0
    for k in range(n):
        i = first + k
        r = order[k]
        lo = offsets[r]
        length = offsets[r + 1] - lo
        j = 0
        cur = -1
        run = 0
        while j < length:
            b = ids[lo + j]
            s = stamp[b]
            if s < head or (s == head and j >= top):
                break
            if s != cur:
                if run:
                    live[cur] -= run
                cur = s
                run = 0
            run += 1
            stamp[b] = i
            j += 1
        if run:
            live[cur] -= run
        h = j
        while j < length:
            stamp[ids[lo + j]] = i
            j += 1
        hits[r] = min(h, hit_limit[r]) * block_size
        live[i] = length
        count += length - h + missing[r]
        while count > capacity:
            excess = count - capacity
            if miss_left > 0:
                take = min(excess, miss_left)
                miss_left -= take
                count -= take
                continue
            owned = live[head]
            if owned > excess:
                live[head] = owned - excess
                top -= excess
                count -= excess
                break
            live[head] = 0
            count -= owned
            head += 1
            if head - first < n:
                rr = order[head - first]
                miss_left = missing[rr]
                top = offsets[rr + 1] - offsets[rr]


@nb.njit(cache=True)
def replay_fixed_chained(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    capacity: int,
    order: I64,
    starts: I64,
) -> I64:
    """``replay_fixed`` for chained ids (request-granular LRU, see the comment above)."""
    hits = np.zeros(prompt_blocks.size, np.int64)
    stamp = np.full(n_ids, -1, np.int32)
    live = np.zeros(order.size, np.int32)
    for k in range(starts.size - 1):
        _replay_chained_stream(
            offsets,
            ids,
            prompt_blocks,
            missing,
            hit_limit,
            block_size,
            capacity,
            order[starts[k] : starts[k + 1]],
            starts[k],
            stamp,
            live,
            hits,
        )
    return hits


@nb.njit(cache=True, inline="always")
def _fenwick_add(tree: Any, i: int, delta: int) -> None:
    i += 1
    while i < tree.size:
        tree[i] += delta
        i += i & -i


@nb.njit(cache=True, inline="always")
def _fenwick_prefix(tree: Any, i: int) -> int:
    """Sum of entries ``0 .. i``."""
    s = 0
    i += 1
    while i > 0:
        s += tree[i]
        i -= i & -i
    return s


_LOW32 = np.int64(0xFFFFFFFF)
_STEP_SHIFT = 15  # histogram depths are accumulated 32,768 at a time (256 KiB, cache resident)


@nb.njit(cache=True, inline="always")
def _close_run(
    events: I64,
    n_events: int,
    depth0: int,
    a: int,
    e: int,
    full: int,
    block_size: int,
) -> int:
    """Record the run ``[a, e)`` (depths ``depth0 + (j - a)``) as difference events."""
    f_end = min(e, full)
    if f_end > a:
        events[n_events] = (depth0 << 32) | block_size
        events[n_events + 1] = ((depth0 + f_end - a) << 32) | (-block_size & _LOW32)
        n_events += 2
    return n_events


@nb.njit(cache=True, boundscheck=False)
def _depth_chained_stream(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    order: I64,
    first: int,
    stamp: Any,
    created: Any,
    tree: Any,
    events: I64,
    n_events: int,
    k_start: int,
    moved_total: int,
) -> tuple[int, int, int]:
    """Stack depths at request granularity (the entries of ``_replay_chained_stream``).

    Every block accessed before is in the LRU stack (no eviction); the blocks of request i's
    seen prefix come in runs owned by one earlier entry e (stamps never increase along a
    chain). A run starting at position a owns e's positions a.. (the lower ones belong to
    later entries), so position j of it has depth 1 + (j - a) + (blocks owned by entries
    after e). Those are the blocks created by entries after e (a running prefix sum) minus
    the blocks since moved out of them by refreshes (a Fenwick tree over entries, one update
    and one query per run). A run weighs a range of consecutive depths, recorded as two
    difference events, so the work per request is its
    chain walk plus O(log n) per run; the events are summed by depth afterwards.

    Processes requests ``k_start ..`` and returns where it stopped (when ``events`` might
    overflow), the event count and ``moved_total`` (blocks moved out of their entry so far).
    """
    n = order.size
    for k in range(k_start, n):
        i = first + k
        r = order[k]
        lo = offsets[r]
        length = offsets[r + 1] - lo
        if n_events + 2 * length + 4 > events.size:
            return k, n_events, moved_total  # the caller grows the buffer and resumes
        full = hit_limit[r]  # chain positions < full weigh a whole block, the rest nothing
        j = 0
        cur = -2
        a = 0
        depth0 = 0
        while j < length:
            b = ids[lo + j]
            s = stamp[b]
            if s != cur:
                if s < first:
                    break
                if cur >= 0:
                    n_events = _close_run(events, n_events, depth0, a, j, full, block_size)
                    _fenwick_add(tree, cur - first, j - a)
                e = s - first
                after = created[k] - created[e + 1] - moved_total + _fenwick_prefix(tree, e)
                cur = s
                a = j
                depth0 = 1 + after
            stamp[b] = i
            j += 1
        if cur >= 0:
            n_events = _close_run(events, n_events, depth0, a, j, full, block_size)
            _fenwick_add(tree, cur - first, j - a)
        moved_total += j
        while j < length:
            stamp[ids[lo + j]] = i
            j += 1
        created[k + 1] = created[k] + length + missing[r]
    return n, n_events, moved_total


@nb.njit(cache=True)
def _depth_events_chained(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
) -> tuple[I64, int]:
    """Difference events ``(depth, weight)`` of the token-weighted depth histogram, packed."""
    stamp = np.full(n_ids, -1, np.int32)
    longest = 0
    for k in range(starts.size - 1):
        longest = max(longest, starts[k + 1] - starts[k])
    tree = np.zeros(longest + 1, np.int32)
    created = np.zeros(longest + 1, np.int32)  # < 2^31 accesses per replica (caller checks)
    events = np.empty(max(4 * order.size, 64), np.int64)
    n_events = 0
    for k in range(starts.size - 1):
        n = starts[k + 1] - starts[k]
        tree[: n + 1] = 0
        created[0] = 0
        done = 0
        moved_total = 0
        while done < n:
            done, n_events, moved_total = _depth_chained_stream(
                offsets,
                ids,
                prompt_blocks,
                missing,
                hit_limit,
                block_size,
                order[starts[k] : starts[k + 1]],
                starts[k],
                stamp,
                created,
                tree[: n + 1],
                events,
                n_events,
                done,
                moved_total,
            )
            if done < n:
                grown = np.empty(2 * events.size, np.int64)
                grown[:n_events] = events[:n_events]
                events = grown
    return events, n_events


@nb.njit(cache=True)
def stack_depth_histogram_chained(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    hist_size: int,
) -> I64:
    """``stack_depth_histogram_exact`` at request granularity (same result, far fewer steps)."""
    events, n_events = _depth_events_chained(
        offsets, ids, prompt_blocks, missing, hit_limit, block_size, n_ids, order, starts
    )
    diff = np.zeros(hist_size + 1, np.int64)
    for q in range(n_events):
        ev = events[q]
        diff[min(ev >> 32, hist_size)] += np.int32(ev & _LOW32)
    return np.cumsum(diff[:hist_size])


@nb.njit(cache=True)
def hit_steps_chained(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    hist_size: int,
) -> tuple[I64, I64]:
    """The curve's steps: capacities (blocks) where hit tokens rise, and hit tokens there.

    Equal to the nonzero depths of ``stack_depth_histogram_chained`` and the running sum of
    their weights. The events are bucketed by depth (one counting pass and one scatter), then
    each bucket is summed in a small cache-resident window, so no histogram over every depth
    is ever materialised.
    """
    events, n_events = _depth_events_chained(
        offsets, ids, prompt_blocks, missing, hit_limit, block_size, n_ids, order, starts
    )
    width = 1 << _STEP_SHIFT
    n_buckets = (hist_size >> _STEP_SHIFT) + 1
    bucket_start = np.zeros(n_buckets + 1, np.int64)
    for q in range(n_events):
        bucket_start[min(events[q] >> 32, hist_size) >> _STEP_SHIFT] += 1
    total = 0
    for x in range(n_buckets):
        c = bucket_start[x]
        bucket_start[x] = total
        total += c
    bucket_start[n_buckets] = total
    fill = bucket_start[:n_buckets].copy()
    grouped = np.empty(n_events, np.int64)
    for q in range(n_events):
        x = min(events[q] >> 32, hist_size) >> _STEP_SHIFT
        grouped[fill[x]] = events[q]
        fill[x] += 1
    window = np.zeros(width, np.int64)
    # at most one step per depth; pages past the last step are never touched
    caps = np.empty(hist_size, np.int64)
    hits = np.empty(hist_size, np.int64)
    steps = 0
    h = 0  # histogram value at the current depth
    cumulative = 0
    for x in range(n_buckets):
        lo_ev = bucket_start[x]
        hi_ev = bucket_start[x + 1]
        if hi_ev == lo_ev and h == 0:
            continue
        base = x << _STEP_SHIFT
        for q in range(lo_ev, hi_ev):
            ev = grouped[q]
            window[min(ev >> 32, hist_size) - base] += np.int32(ev & _LOW32)
        end = min(width, hist_size - base)
        for d in range(end):
            h += window[d]
            if h != 0:
                cumulative += h
                caps[steps] = base + d
                hits[steps] = cumulative
                steps += 1
        window[:] = 0
    return caps[:steps], hits[:steps]


@nb.njit(cache=True)
def group_by_replica(replica: I64, replicas: int) -> tuple[I64, I64]:
    """Request indices grouped by replica, arrival order kept (a stable counting sort)."""
    starts = np.zeros(replicas + 1, np.int64)
    for r in range(replica.size):
        starts[replica[r] + 1] += 1
    for k in range(replicas):
        starts[k + 1] += starts[k]
    fill = starts[:replicas].copy()
    order = np.empty(replica.size, np.int64)
    for r in range(replica.size):
        k = replica[r]
        order[fill[k]] = r
        fill[k] += 1
    return order, starts


@nb.njit(cache=True, boundscheck=False)
def replay_fixed_chained_interleaved(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    capacity: int,
    replica: I64,
    order: I64,
    starts: I64,
) -> I64:
    """``replay_fixed_chained`` walking requests in arrival order across all replicas.

    Same entries and rules, but each replica has its own stamp row (stamps are request
    indices), so the block ids are read sequentially instead of one replica at a time; costs
    ``n_ids × replicas`` int32 of memory. ``order``/``starts`` (requests grouped by replica)
    only tell eviction which entry of a replica comes next.
    """
    n = prompt_blocks.size
    replicas = starts.size - 1
    hits = np.zeros(n, np.int64)
    stamp = np.full((n_ids, replicas), -1, np.int32)
    live = np.zeros(n, np.int32)
    head_at = starts[:replicas].copy()  # position in ``order`` of each replica's oldest entry
    head = np.zeros(replicas, np.int64)
    miss_left = np.zeros(replicas, np.int64)
    top = np.zeros(replicas, np.int64)
    count = np.zeros(replicas, np.int64)
    for k in range(replicas):
        if starts[k + 1] > starts[k]:
            r0 = order[starts[k]]
            head[k] = r0
            miss_left[k] = missing[r0]
            top[k] = offsets[r0 + 1] - offsets[r0]
    for r in range(n):
        k = replica[r]
        hd = head[k]
        tp = top[k]
        lo = offsets[r]
        length = offsets[r + 1] - lo
        j = 0
        cur = -1
        run = 0
        while j < length:
            b = ids[lo + j]
            s = stamp[b, k]
            if s < hd or (s == hd and j >= tp):
                break
            if s != cur:
                if run:
                    live[cur] -= run
                cur = s
                run = 0
            run += 1
            stamp[b, k] = r
            j += 1
        if run:
            live[cur] -= run
        h = j
        while j < length:
            stamp[ids[lo + j], k] = r
            j += 1
        hits[r] = min(h, hit_limit[r]) * block_size
        live[r] = length
        c = count[k] + length - h + missing[r]
        ml = miss_left[k]
        while c > capacity:
            excess = c - capacity
            if ml > 0:
                take = min(excess, ml)
                ml -= take
                c -= take
                continue
            owned = live[hd]
            if owned > excess:
                live[hd] = owned - excess
                tp -= excess
                c -= excess
                break
            live[hd] = 0
            c -= owned
            head_at[k] += 1
            if head_at[k] < starts[k + 1]:
                hd = order[head_at[k]]
                ml = missing[hd]
                tp = offsets[hd + 1] - offsets[hd]
            else:
                hd = n
        count[k] = c
        miss_left[k] = ml
        head[k] = hd
        top[k] = tp
    return hits
