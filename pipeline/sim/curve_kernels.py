"""Hit tokens at every cache capacity in one pass: LRU stack depths (numba).

A capacity-C LRU cache holds exactly the C most recently accessed distinct blocks, so a lookup
of block j hits in every cache of size ≥ its stack depth d (1 + distinct blocks accessed since
its last access), and one histogram of depths gives the hit count at every capacity (Mattson et
al., Evaluation techniques for storage hierarchies, IBM Systems Journal 9(2), 1970). Accesses
are the blocks each request inserts or refreshes, tail first (its unknown output blocks, then its chain from the last block to block 0), as the
``instant`` replay of ``pipeline.sim.kernels.replay`` does (vLLM frees blocks in reverse so the
shared head is the most recent, ``single_type_kv_cache_manager.py`` L591-599): every parent is
then more recent than its children, so with chained ids (``kernels.is_chained``) each cache is
prefix-closed and a prompt block hits iff its depth is ≤ C. Block j of request r weighs B tokens
when ``j < hit_limit[r]`` (``pipeline.prefix.cache_rules.hit_limit_blocks``, vLLM's rule), else none.

Two production paths:
- ``hit_steps_chained``: exact, at request granularity (one Fenwick query per run of blocks last
  touched by the same request; see ``_depth_chained_stream``);
- ``stack_depth_histogram``: SHARDS sampling (Waldspurger et al., FAST 2015) for very long traces,
  on a bitmap-bucketed Fenwick tree over access positions (Bennett & Kruskal 1975).
Exact block-level oracles for both live in ``perf/sim_oracles.py``. Both are called through
Python functions of the same name that check sizes and indices first (as ``kernels`` does).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

from pipeline.prefix.hashmap import splitmix64
from pipeline.sim.kernels import (
    INT32_LIMIT,
    check_blocks,
    check_chains,
    check_streams,
    guarded,
    require,
)

I64 = NDArray[np.int64]

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_BUCKET_SHIFT = 9  # Fenwick leaves are buckets of 512 positions = 8 bit-words (one cache line)
_NEAR = 1024  # positions within this distance of the end are counted on the bitmap directly
_LOW32 = np.int64(0xFFFFFFFF)
_STEP_SHIFT = 15  # histogram depths are accumulated 32,768 at a time (256 KiB, cache resident)


# ---------------------------------------------------------------------------------------------
# Exact, at request granularity (chained ids)
# ---------------------------------------------------------------------------------------------
# With chained ids and tail-first refresh, request i's accesses form one stack entry: its
# unknown output blocks, then its chain from the last block to block 0. A block belongs to the
# entry of the last request that touched it (stamp[id] = that request's index in the stream). A
# later request that refreshes block j also refreshes every ancestor, so the blocks an entry
# still owns are a suffix of its chain positions, ordered by depth within the entry.


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
    """Stack depths at request granularity (the entries described above).

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
def _hit_steps_chained(
    offsets: I64,
    ids: Any,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    hist_size: int,
) -> tuple[I64, I64]:
    """The curve's steps: capacities (blocks) where hit tokens rise, and hit tokens there.

    Equal to the nonzero depths of the block-level token-weighted depth histogram and the
    running sum of their weights (``perf/sim_oracles.py``). The events are bucketed by depth
    (one counting pass and one scatter), then each bucket is summed in a small cache-resident
    window, so no histogram over every depth
    is ever materialised.
    """
    events, n_events = _depth_events_chained(
        offsets, ids, missing, hit_limit, block_size, n_ids, order, starts
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


# ---------------------------------------------------------------------------------------------
# SHARDS: sampled depths on a Fenwick tree over access positions
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


@nb.njit(cache=True)
def _depth_stream(
    offsets: I64,
    ids: Any,
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
    rate = (float(sample_threshold) + 1.0) / 18446744073709551616.0
    scale = 1.0 / rate
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
            if splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold:
                continue
            hist[0] += w * scale  # sampled lookup weight, for the ratio estimator
            p = last[b]
            if p < 0:
                continue  # first sampled access of this block (its sampled parent may be older)
            if prev_p - p == 1:
                depth += 1  # adjacent positions: no mark between, one deeper (common case)
            elif t - p <= _NEAR:
                depth = _marks_after(bits, p, t) + 1
            else:
                depth = marks - _marks_upto(tree, bits, p) + 1
            prev_p = p
            idx = int(depth * scale + 0.5)
            if idx >= hist_size:
                idx = hist_size - 1
            hist[idx] += w * scale
        # accesses, tail first; Fenwick updates are batched per bucket
        t_start = t
        for _ in range(missing[r]):
            anon += _ONE
            if splitmix64(anon ^ ~sample_salt) > sample_threshold:
                continue
            bits[t >> 6] |= _ONE << np.uint64(t & 63)
            t += 1
        cur = -1
        acc = 0
        for j in range(hi - 1, lo - 1, -1):
            b = ids[j]
            if splitmix64(np.uint64(b) ^ sample_salt) > sample_threshold:
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
def _stack_depth_histogram(
    offsets: I64,
    ids: Any,
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
    without a query. Only blocks whose salted hash falls under ``sample_threshold`` (rate R =
    (threshold + 1) / 2^64 < 1) are tracked, and depths and weights are scaled by 1/R (SHARDS,
    Waldspurger et al., FAST 2015); ``hist[0]`` collects the scaled weight of every sampled
    lookup for the caller's ratio estimator. The exact curve is ``hit_steps_chained``.
    """
    hist = np.zeros(hist_size, np.float64)
    for k in range(starts.size - 1):
        _depth_stream(
            offsets,
            ids,
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
# Entry points: each kernel behind its check
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _stream_accesses(lengths: I64, missing: Any, order: I64, starts: I64) -> I64:
    """Block accesses (chain blocks and unknown output blocks) of each stream's requests,
    summed without an array per request (the streams of a sampled quarter are long)."""
    out = np.zeros(starts.size - 1, np.int64)
    for k in range(starts.size - 1):
        for i in range(starts[k], starts[k + 1]):
            r = order[i]
            out[k] += lengths[r] + missing[r]
    return out


def _check_curve_inputs(kernel: str, a: dict[str, Any]) -> None:
    """Sizes both curve kernels rely on: chains and streams in range, depths, positions and
    the block size within the int32 fields they are packed into."""
    missing, order, starts = a["missing"], a["order"], a["starts"]
    lengths = check_chains(
        kernel, a["offsets"], a["ids"], a["n_ids"], missing=missing, hit_limit=a["hit_limit"]
    )
    check_blocks(kernel, lengths, missing, a["hit_limit"])
    check_streams(kernel, order, starts, lengths.size, 2**62)
    require(1 <= a["block_size"] <= INT32_LIMIT, kernel, "block_size must lie in 1..2^31-1")
    accesses = _stream_accesses(lengths, missing, order, starts)
    most = int(accesses.max(initial=0))
    require(most < INT32_LIMIT, kernel, "more than 2^31 block accesses in one stream")
    # a depth never exceeds the accesses, so a larger histogram is only wasted memory
    top, hist_size = int(accesses.sum()) + 2, a["hist_size"]
    require(1 <= hist_size <= top, kernel, f"hist_size must lie in 1..{top}, got {hist_size}")


hit_steps_chained = guarded(_hit_steps_chained, _check_curve_inputs)
stack_depth_histogram = guarded(_stack_depth_histogram, _check_curve_inputs)


# ---------------------------------------------------------------------------------------------
# SHARDS sample of a table read part by part (pipeline.sim.curve_stream)
# ---------------------------------------------------------------------------------------------


# Columns of sample_chains' per-request counts (int32: a request's blocks fit).
SAMPLED, SAMPLED_HITTABLE, HALF, HALF_HITTABLE, MISSING, MISSING_HALF = range(6)


@nb.njit(cache=True)
def sample_chains(
    offsets: I64,
    hashes: NDArray[np.uint64],
    stride: int,
    namespace_mix: NDArray[np.uint64],
    hit_limit: I64,
    missing: I64,
    threshold: np.uint64,
    half: np.uint64,
    salt: np.uint64,
    anon: np.uint64,
) -> tuple[NDArray[np.uint64], NDArray[np.bool_], NDArray[np.int32], np.uint64]:
    """The blocks of each request's chain (stored hashes, every ``stride``-th: block k of the
    coarser size ends where stored block ``stride·k + stride − 1`` ends) whose namespaced key
    ``hash ^ namespace_mix[r]`` passes the SHARDS filter ``splitmix64(key ^ salt) ≤ threshold``.

    Returns the sampled keys in request and chain order, whether each falls in the first half
    sample (``≤ half``), and per request (a row, columns ``SAMPLED`` …): sampled blocks,
    sampled blocks below its hit limit (a prefix of its sampled blocks), the same two of the
    first half, sampled unknown output blocks (``missing[r]`` anonymous blocks numbered on from
    ``anon``, filtered on ``~salt``) and those of the first half; then the anonymous counter
    after the last request. The halves' counts are what lets the caller split the sample
    without a per-block owner array.
    """
    n = offsets.size - 1
    total = 0
    for r in range(n):
        lo = offsets[r]
        for k in range((offsets[r + 1] - lo) // stride):
            key = hashes[lo + k * stride + stride - 1] ^ namespace_mix[r]
            if splitmix64(key ^ salt) <= threshold:
                total += 1
    keys = np.empty(total, np.uint64)
    in_half = np.empty(total, np.bool_)
    counts = np.zeros((n, 6), np.int32)
    t = 0
    for r in range(n):
        lo = offsets[r]
        for k in range((offsets[r + 1] - lo) // stride):
            key = hashes[lo + k * stride + stride - 1] ^ namespace_mix[r]
            v = splitmix64(key ^ salt)
            if v <= threshold:
                first = v <= half
                keys[t] = key
                in_half[t] = first
                t += 1
                counts[r, SAMPLED] += 1
                hittable = k < hit_limit[r]
                if hittable:
                    counts[r, SAMPLED_HITTABLE] += 1
                if first:
                    counts[r, HALF] += 1
                    if hittable:
                        counts[r, HALF_HITTABLE] += 1
        for _ in range(missing[r]):
            anon += _ONE
            v = splitmix64(anon ^ ~salt)
            if v <= threshold:
                counts[r, MISSING] += 1
                if v <= half:
                    counts[r, MISSING_HALF] += 1
    return keys, in_half, counts, anon
