"""The replay kernel (numba): one event-driven pass in arrival order through per-replica caches.

A workload arrives as CSR-style arrays: request ``r`` owns block ids ``ids[offsets[r]:offsets[r+1]]``
(dense ids 0..n_ids-1 of its chained hashes, already keyed by cache namespace: model, LoRA
adapter, tenant when isolated), the first ``prompt_blocks[r]`` of which are prompt blocks, plus
``missing[r]`` output blocks whose tokens are unknown: they occupy capacity, never match, and are
anonymous (their tokens are not in the trace). ``hit_limit[r]`` = ⌊(P − 1) / B⌋ capped at the
prompt blocks comes precomputed from ``pipeline.prefix.cache_rules.hit_limit_blocks``.

Rules implemented (vLLM 0.33.0 automatic prefix caching, ``vllm/v1/core`` of its wheel):
- Lookup walks the prompt's chain from block 0 and stops at the first uncached block
  (``find_longest_cache_hit``, ``single_type_kv_cache_manager.py`` ~L743-797); blocks pinned by
  running requests count as cached, since vLLM caches a block when its work is scheduled
  (``allocate_slots`` → ``cache_blocks``, ``kv_cache_manager.py`` L613-627). Hit tokens =
  min(cached blocks, hit_limit) × B (``get_computed_blocks``, L266-327).
- Admission pins every block of the request's chain (prompt and known output) and its anonymous
  blocks: a block's ref count goes up, a free cached block leaves the free queue (``touch``,
  ``block_pool.py`` L792-810), a new block counts toward the replica's cached blocks. Then free
  blocks are evicted least-recently-freed first while the replica holds more than ``capacity``.
- Release (when the request finishes) unpins tail first: the anonymous run, then the chain from
  its last block to block 0 (``free_blocks(reversed(blocks))``, ``single_type_kv_cache_manager.py``
  L591-599); a block whose ref count reaches 0 is appended to the free queue (``append_n``,
  ``block_pool.py`` L816-850), so the shared head is freed last and evicted last; then eviction
  runs again. Pinned blocks are never evicted: while running requests pin more than
  ``capacity`` blocks the replica holds more (the peak of pinned blocks is reported).
- A request that arrives at t first sees every request on its replica whose finish ≤ t released,
  in finish order (ties: request index). Lifetimes: ``instant`` releases right after admission
  (duration 0: the request's blocks are refreshed tail first and evicted LRU down to capacity,
  the model of the one-pass curve); ``durations`` releases at arrival + duration, where a request
  admitted while its replica has n requests in flight (itself included) takes
  ``base × max(1, n / replica_slots)`` µs, rounded down (processor sharing past
  ``replica_slots``; 0 disables). Requests in flight (for routing) always follow the durations,
  whatever the lifetime.
- Shedding (``timeout`` µs, 0 disables): a request its replica would stretch past the timeout
  (admitted past ``replica_slots`` with a stretched duration above ``timeout``) is shed on
  arrival: it is routed (the router's counters count it) but looked up, admitted and counted
  in flight nowhere, and its hit tokens are 0. Its client would have given up on it; a
  replica that overloaded holds it in vLLM's waiting queue, which pins no blocks. So a
  replica runs at most ``replica_slots`` requests admitted at or under its slots plus those of
  the last ``timeout`` µs, however far the arrivals outrun it.
- Routing: ``FIXED`` replays one replica's stream (the caller assigned it); ``LEAST_LOADED`` sends
  a request to the replica with the fewest requests in flight (ties: lowest index; it reads no
  cache state, so ``replay.assign`` runs this loop without blocks and the replicas' streams are
  then replayed one at a time);
  ``CACHE_AWARE`` applies sgl-router's ``select_worker`` (sglang-router 0.3.2
  ``src/policies/cache_aware.rs`` L351-461) on the replicas' exact
  caches, as KV-event-driven routers see them, not on sgl-router's approximate character tree.

Every kernel is called through a Python function of the same name that checks its sizes and
indices first (:func:`check_chains`, :func:`check_streams`): numba does not bounds-check, so a
negative capacity or an id past ``n_ids`` would otherwise read or write outside its arrays.

Per-block state, one int32 per block id and replica: ``NOT_CACHED`` (-1); pinned, ≤ -2, with ref
count ``-state - 1``; free, ≥ 0, the position of its entry in the replica's free queue. It is
held block-major (``state[block, replica]``): the cache-aware router reads one block's state on
every replica at once, one or two cache lines instead of one per replica. The free
queue is append-only with lazy deletion (an entry is live iff the block's state still points at
it; anonymous blocks enter as one run entry ``-m``, always live, evicted from the front of the
run) and is compacted in place when full; it is sized so compaction is amortised O(1).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

from pipeline.errors import EnginefitError
from pipeline.prefix.hashmap import splitmix64

I64 = NDArray[np.int64]
Flags = NDArray[np.bool_]

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)

# Routing inside the event loop.
FIXED = 0
LEAST_LOADED = 1
CACHE_AWARE = 2

NOT_CACHED = -1
_PINNED_ONCE = -2
# Columns of the per-replica queue record.
_HEAD = 0  # first queue position that may hold a live entry
_TAIL = 1  # next free queue position
_COUNT = 2  # cached blocks (pinned + free, anonymous included)
_PINNED = 3  # pinned blocks (anonymous included)
_PEAK = 4  # most pinned blocks after any admission (durations lifetime)
_QUEUE_FIELDS = 5
# Positions and ids held in int32 (block state, queue entries, curve positions) stay below this.
INT32_LIMIT = 2**31 - 1
# Arrivals lie within ±2^61 µs and durations (stretched ones saturate) within 2^61 µs (73,000
# years), so arrival + duration never overflows int64.
MAX_DURATION_US = 2**61
# Block state and free queues the replay allocates (rows × (n_ids + queue_size) int32), at most.
MAX_STATE_BYTES = 4 << 30  # 4 GiB


# ---------------------------------------------------------------------------------------------
# Guards: what every entry point checks before its kernel runs
# ---------------------------------------------------------------------------------------------


class KernelArgumentError(EnginefitError, ValueError):
    """A kernel was called with sizes or indices that would take it outside its arrays."""


def require(ok: bool, kernel: str, what: str) -> None:
    if not ok:
        raise KernelArgumentError(f"{kernel} kernel: {what}")


def check_chains(
    kernel: str,
    offsets: I64,
    ids: Any,
    n_ids: int,
    checked: int = 0,
    **per_request: NDArray[Any],
) -> I64:
    """Check the CSR chains (``offsets`` from 0 to ``ids.size``, ids in ``0..n_ids-1``; the
    first ``checked`` ids were checked before, by an earlier call) and that each array of
    ``per_request`` holds one value per request; returns each request's length."""
    require(offsets.ndim == 1 and offsets.size >= 1, kernel, "offsets needs n + 1 entries")
    lengths = np.diff(offsets)
    require(
        int(offsets[0]) == 0 and int(offsets[-1]) == ids.size and bool((lengths >= 0).all()),
        kernel,
        f"offsets must rise from 0 to the {ids.size} block ids",
    )
    require(1 <= n_ids <= INT32_LIMIT, kernel, f"n_ids must lie in 1..2^31-1, got {n_ids}")
    unchecked = ids[checked:]
    if unchecked.size:
        require(
            int(unchecked.min()) >= 0 and int(unchecked.max()) < n_ids,
            kernel,
            f"block ids must lie in 0..{n_ids - 1}",
        )
    for name, values in per_request.items():
        require(
            values.shape == lengths.shape,
            kernel,
            f"{name} needs one value per request ({lengths.size}), has {values.size}",
        )
    return lengths


def check_blocks(kernel: str, lengths: I64, missing: I64, hit_limit: I64) -> None:
    """Unknown output blocks are counts; lookups stay inside each request's chain."""
    require(bool((missing >= 0).all()), kernel, "missing block counts must be ≥ 0")
    require(
        bool(((hit_limit >= 0) & (hit_limit <= lengths)).all()),
        kernel,
        "hit_limit must lie between 0 and each request's chain length",
    )


def check_streams(kernel: str, order: I64, starts: I64, n: int, max_streams: int) -> None:
    """``order[starts[s]:starts[s+1]]`` are request indices, at most ``max_streams`` streams."""
    require(
        starts.ndim == 1 and 1 <= starts.size <= max_streams + 1,
        kernel,
        f"starts needs 2..{max_streams + 1} entries, has {starts.size}",
    )
    require(
        int(starts[0]) >= 0
        and int(starts[-1]) <= order.size
        and bool((np.diff(starts) >= 0).all()),
        kernel,
        f"starts must rise within the {order.size} entries of order",
    )
    if order.size:
        require(
            int(order.min()) >= 0 and int(order.max()) < n,
            kernel,
            f"order must hold request indices 0..{n - 1}",
        )


def check_replicas(kernel: str, replicas: int) -> None:
    require(replicas >= 1, kernel, f"replicas must be ≥ 1, got {replicas}")


def check_replica_indices(kernel: str, replica: I64, replicas: int) -> None:
    check_replicas(kernel, replicas)
    if replica.size:
        require(
            int(replica.min()) >= 0 and int(replica.max()) < replicas,
            kernel,
            f"replica indices must lie in 0..{replicas - 1}",
        )


# ---------------------------------------------------------------------------------------------
# Ingest helpers: chain structure and stable string hashes
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _is_chained(offsets: I64, ids: Any, n_ids: int) -> bool:
    """True when every block id always follows the same parent at the same position.

    That is the chained-hash structure (a block key identifies its whole prefix); it makes
    every LRU cache prefix-closed, which the one-pass curve (``curve_kernels``) relies on.
    """
    # (parent + 1, position) of each id packed in one int64 (one memory access a block);
    # -1 = not seen yet (a packed pair is never negative: parent ≥ -1, ids and positions < 2^31)
    seen = np.full(n_ids, -1, np.int64)
    for r in range(offsets.size - 1):
        prev = -1
        for j in range(offsets[r], offsets[r + 1]):
            b = ids[j]
            pair = ((prev + 1) << 32) | (j - offsets[r])
            if seen[b] == -1:
                seen[b] = pair
            elif seen[b] != pair:
                return False
            prev = b
    return True


@nb.njit(cache=True)
def _fnv1a_strings(offsets: I64, data: NDArray[np.uint8]) -> NDArray[np.uint64]:
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
# Routing that does not depend on cache state or load
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _argmin(values: I64) -> int:
    best = 0
    for k in range(1, values.size):
        if values[k] < values[best]:
            best = k
    return best


@nb.njit(cache=True)
def _least_served(tokens: I64, replicas: int) -> I64:
    """Each request goes to the replica that has served the fewest tokens so far (ties: lowest)."""
    return _least_served_from(tokens, np.zeros(replicas, np.int64))


@nb.njit(cache=True)
def _least_served_from(tokens: I64, served: I64) -> I64:
    """:func:`_least_served` continuing from the tokens each replica has ``served`` (updated)."""
    n = tokens.size
    out = np.empty(n, np.int64)
    for r in range(n):
        k = _argmin(served)
        out[r] = k
        served[k] += tokens[r]
    return out


@nb.njit(cache=True)
def _bounded_affinity(home: I64, replicas: int, margin: float) -> tuple[I64, int]:
    """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018).

    Request ``i`` (0-based) stays on its home replica unless that would take the home's count
    of served requests above ``ceil((1 + margin) × (i + 1) / R)``; then it spills to the replica
    that has served the fewest requests (ties: lowest index).
    """
    return _bounded_affinity_from(home, np.zeros(replicas, np.int64), 0, margin)


@nb.njit(cache=True)
def _bounded_affinity_from(home: I64, served: I64, start: int, margin: float) -> tuple[I64, int]:
    """:func:`_bounded_affinity` of requests ``start``, ``start + 1``, ... continuing from the
    requests each replica has ``served`` (updated)."""
    n = home.size
    replicas = served.size
    out = np.empty(n, np.int64)
    spills = 0
    for i in range(n):
        k = home[i]
        bound = np.ceil((1.0 + margin) * (start + i + 1) / replicas - 1e-9)
        if served[k] + 1 > bound:
            k = _argmin(served)
            spills += 1
        out[i] = k
        served[k] += 1
    return out, spills


@nb.njit(cache=True)
def _group_by_replica(replica: I64, replicas: int) -> tuple[I64, I64]:
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


# ---------------------------------------------------------------------------------------------
# The event-driven replay
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _earlier(finish: I64, request: I64, a: int, b: int) -> bool:
    """Heap order: finish time, then request index."""
    return bool(finish[a] < finish[b] or (finish[a] == finish[b] and request[a] < request[b]))


@nb.njit(cache=True, inline="always")
def _heap_push(finish: I64, request: I64, n: int, t: int, r: int) -> int:
    i = n
    finish[i] = t
    request[i] = r
    while i > 0:
        p = (i - 1) >> 1
        if not _earlier(finish, request, i, p):
            break
        finish[p], finish[i] = finish[i], finish[p]
        request[p], request[i] = request[i], request[p]
        i = p
    return n + 1


@nb.njit(cache=True, inline="always")
def _heap_pop(finish: I64, request: I64, n: int) -> int:
    n -= 1
    finish[0] = finish[n]
    request[0] = request[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _earlier(finish, request, c + 1, c):
            c += 1
        if not _earlier(finish, request, c, i):
            break
        finish[c], finish[i] = finish[i], finish[c]
        request[c], request[i] = request[i], request[c]
        i = c
    return n


@nb.njit(cache=True)
def _compact(buf: Any, state: Any, head: int, tail: int) -> int:
    """Move the live queue entries to the front (order kept); returns the new tail."""
    w = 0
    for pos in range(head, tail):
        e = buf[pos]
        if e < 0:
            buf[w] = e
            w += 1
        elif state[e] == pos:
            buf[w] = e
            state[e] = w
            w += 1
    return w


@nb.njit(cache=True, inline="always")
def _evict(state: Any, buf: Any, queue: Any, capacity: int) -> None:
    """Evict free blocks, least recently freed first, while more than ``capacity`` are cached."""
    head = queue[_HEAD]
    tail = queue[_TAIL]
    count = queue[_COUNT]
    while count > capacity and head < tail:
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
            if state[e] == head:
                state[e] = NOT_CACHED
                count -= 1
            head += 1
    queue[_HEAD] = head
    queue[_COUNT] = count


@nb.njit(cache=True, inline="always")
def _lookup(state: Any, ids: Any, lo: int, blocks: int) -> int:
    """Leading blocks of ``ids[lo:lo + blocks]`` that are cached (pinned or free)."""
    h = 0
    while h < blocks and state[ids[lo + h]] != NOT_CACHED:
        h += 1
    return h


@nb.njit(cache=True, inline="always")
def _admit(
    state: Any, buf: Any, queue: Any, ids: Any, lo: int, hi: int, anonymous: int, capacity: int
) -> None:
    """Pin the request's chain ``ids[lo:hi]`` and its anonymous blocks, then evict."""
    count = queue[_COUNT] + anonymous
    pinned = queue[_PINNED] + anonymous
    for j in range(lo, hi):
        b = ids[j]
        s = state[b]
        if s == NOT_CACHED:
            count += 1
            pinned += 1
            state[b] = _PINNED_ONCE
        elif s >= 0:  # free: its queue entry goes dead
            pinned += 1
            state[b] = _PINNED_ONCE
        else:
            state[b] = s - 1
    queue[_COUNT] = count
    queue[_PINNED] = pinned
    _evict(state, buf, queue, capacity)


@nb.njit(cache=True, inline="always")
def _release(
    state: Any, buf: Any, queue: Any, ids: Any, lo: int, hi: int, anonymous: int, capacity: int
) -> None:
    """Unpin tail first (anonymous run, then the chain from its last block); blocks reaching
    ref 0 join the free queue; then evict."""
    head = queue[_HEAD]
    tail = queue[_TAIL]
    if tail + 1 + (hi - lo) > buf.size:
        tail = _compact(buf, state, head, tail)
        head = 0
        if tail + 1 + (hi - lo) > buf.size:
            raise ValueError("free queue too small for the live entries")
    pinned = queue[_PINNED]
    if anonymous > 0:
        buf[tail] = -anonymous
        tail += 1
        pinned -= anonymous
    for j in range(hi - 1, lo - 1, -1):
        b = ids[j]
        s = state[b]
        if s == _PINNED_ONCE:
            state[b] = tail
            buf[tail] = b
            tail += 1
            pinned -= 1
        else:
            state[b] = s + 1
    queue[_HEAD] = head
    queue[_TAIL] = tail
    queue[_PINNED] = pinned
    _evict(state, buf, queue, capacity)


@nb.njit(cache=True, inline="always")
def _refresh(
    state: Any, buf: Any, queue: Any, ids: Any, lo: int, hi: int, anonymous: int, capacity: int
) -> None:
    """``_admit`` then ``_release`` of one request in one pass (the instant lifetime): its
    anonymous run and then its chain, tail first, go to the back of the free queue (a block
    met again, in a chain that repeats one, moves back again: it ends where its first
    occurrence puts it, as when its last reference is released), new blocks count toward the
    cache, then free blocks are evicted from the front down to ``capacity``. Admission's own
    eviction would have taken the same entries in the same order: the request's blocks,
    pinned then, were behind every other free block, as they are now at the back."""
    head = queue[_HEAD]
    tail = queue[_TAIL]
    need = hi - lo + 1
    if tail + need > buf.size:
        tail = _compact(buf, state, head, tail)
        head = 0
        if tail + need > buf.size:
            raise ValueError("free queue too small for the live entries")
    count = queue[_COUNT] + anonymous
    if anonymous > 0:
        buf[tail] = -anonymous
        tail += 1
    for j in range(hi - 1, lo - 1, -1):
        b = ids[j]
        if state[b] == NOT_CACHED:
            count += 1
        state[b] = tail
        buf[tail] = b
        tail += 1
    queue[_HEAD] = head
    queue[_TAIL] = tail
    queue[_COUNT] = count
    _evict(state, buf, queue, capacity)


@nb.njit(cache=True)
def _instant_stream(
    offsets: I64,
    ids: Any,
    missing: I64,
    hit_limit: I64,
    block_size: int,
    order: I64,
    chosen: I64,
    capacity: int,
    state: Any,
    buf: Any,
    queue: I64,
    hits: I64,
) -> None:
    """The event loop of fixed streams in the instant lifetime: nothing is ever pinned past
    its own arrival and no routing reads the requests in flight, so each request is a lookup
    and a :func:`_refresh` on its replica ``chosen[r]`` (a column of ``state``, a row of
    ``buf`` and ``queue``), in arrival order (no finish heap)."""
    for i in range(order.size):
        r = order[i]
        k = chosen[r]
        lo = offsets[r]
        hits[r] = _lookup(state[:, k], ids, lo, hit_limit[r]) * block_size
        _refresh(state[:, k], buf[k], queue[k], ids, lo, offsets[r + 1], missing[r], capacity)


@nb.njit(cache=True, inline="always")
def _cache_aware_choice(
    state: Any,
    ids: Any,
    lo: int,
    prompt_blocks: int,
    prompt_tokens: int,
    block_size: int,
    in_flight: I64,
    matched: I64,
    alive: I64,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
) -> tuple[int, bool]:
    """sgl-router ``select_worker``: (replica, whether the imbalance rule chose it).

    Load = requests in flight at arrival. If ``max - min > balance_abs`` and
    ``max > min × balance_rel`` the least loaded replica takes it; otherwise the replica with the
    longest cached prompt prefix (ties: lower load, then lower index, as smg's event-driven mode)
    takes it when matched prompt tokens / prompt tokens > ``cache_threshold``, else the least
    loaded one.
    """
    lightest = _argmin(in_flight)
    low = in_flight[lightest]
    high = in_flight.max()
    if high - low > balance_abs and high > low * balance_rel:
        return lightest, True
    # Every replica's leading cached blocks at once, block by block (the state is block-major),
    # over the replicas still matching (``alive``: scratch, one slot a replica).
    n_alive = in_flight.size
    for q in range(n_alive):
        alive[q] = q
    h = 0
    while n_alive > 0 and h < prompt_blocks:
        row = state[ids[lo + h]]
        kept = 0
        for i in range(n_alive):
            q = alive[i]
            if row[q] != NOT_CACHED:
                alive[kept] = q
                kept += 1
            else:
                matched[q] = h
        n_alive = kept
        h += 1
    for i in range(n_alive):
        matched[alive[i]] = h
    best = 0
    for q in range(in_flight.size):
        if matched[q] > matched[best] or (
            matched[q] == matched[best] and in_flight[q] < in_flight[best]
        ):
            best = q
    rate = matched[best] * block_size / prompt_tokens if prompt_tokens > 0 else 0.0
    return (best if rate > cache_threshold else lightest), False


@nb.njit(cache=True)
def _event_loop(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    prompt_tokens: I64,
    block_size: int,
    arrival: I64,
    base_duration: I64,
    order: I64,
    routing: int,
    capacity: int,
    instant: bool,
    replica_slots: int,
    timeout: int,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
    state: Any,
    buf: Any,
    queue: I64,
    hits: I64,
    chosen: I64,
    shed: Any,
) -> int:
    """Replay requests ``order`` (arrival order) on ``state.shape[1]`` replicas from an empty
    heap (:func:`_event_steps`); returns how many requests the imbalance rule routed."""
    n = order.size
    replicas = state.shape[1]
    finish = np.empty(n, np.int64)
    finishing = np.empty(n, np.int64)
    in_flight = np.zeros(replicas, np.int64)
    balance_routed, _ = _event_steps(
        offsets,
        ids,
        prompt_blocks,
        missing,
        hit_limit,
        prompt_tokens,
        block_size,
        arrival,
        base_duration,
        order,
        routing,
        capacity,
        instant,
        replica_slots,
        timeout,
        cache_threshold,
        balance_abs,
        balance_rel,
        state,
        buf,
        queue,
        hits,
        chosen,
        shed,
        finish,
        finishing,
        0,
        in_flight,
    )
    return balance_routed


@nb.njit(cache=True)
def _event_steps(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    prompt_tokens: I64,
    block_size: int,
    arrival: I64,
    base_duration: I64,
    order: I64,
    routing: int,
    capacity: int,
    instant: bool,
    replica_slots: int,
    timeout: int,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
    state: Any,
    buf: Any,
    queue: I64,
    hits: I64,
    chosen: I64,
    shed: Any,
    finish: I64,
    finishing: I64,
    n_running: int,
    in_flight: I64,
) -> tuple[int, int]:
    """Replay requests ``order`` (arrival order) on ``state.shape[1]`` replicas, continuing
    from the requests already running: the heap ``finish``/``finishing`` (finish time, request
    index; ``n_running`` entries, room for ``order.size`` more) and ``in_flight`` per replica.
    ``FIXED`` serves request ``r`` on replica ``chosen[r]``; the routers fill ``chosen``. Fills
    ``hits`` per request and sets ``shed[r]`` for the requests ``timeout`` sheds; returns how
    many the imbalance rule routed and the requests still running (the heap's new size)."""
    n = order.size
    replicas = state.shape[1]
    matched = np.zeros(replicas, np.int64)
    alive = np.zeros(replicas, np.int64)
    balance_routed = 0
    for i in range(n):
        r = order[i]
        t = arrival[r]
        while n_running > 0 and finish[0] <= t:
            done = finishing[0]
            n_running = _heap_pop(finish, finishing, n_running)
            k = chosen[done]
            in_flight[k] -= 1
            if not instant:
                _release(
                    state[:, k],
                    buf[k],
                    queue[k],
                    ids,
                    offsets[done],
                    offsets[done + 1],
                    missing[done],
                    capacity,
                )
        lo = offsets[r]
        hi = offsets[r + 1]
        k = chosen[r]
        if routing == LEAST_LOADED:
            k = _argmin(in_flight)
        elif routing == CACHE_AWARE:
            k, by_balance = _cache_aware_choice(
                state,
                ids,
                lo,
                prompt_blocks[r],
                prompt_tokens[r],
                block_size,
                in_flight,
                matched,
                alive,
                cache_threshold,
                balance_abs,
                balance_rel,
            )
            if by_balance:
                balance_routed += 1
        chosen[r] = k
        # its duration with itself in flight: stretched past the slots, maybe past the timeout
        running = in_flight[k] + 1
        duration = base_duration[r]
        if replica_slots > 0 and running > replica_slots:
            if duration > MAX_DURATION_US // running:
                duration = MAX_DURATION_US  # never finishes within any trace; no overflow
            else:
                duration = duration * running // replica_slots
            if 0 < timeout < duration:
                shed[r] = True
                continue
        hits[r] = _lookup(state[:, k], ids, lo, hit_limit[r]) * block_size
        _admit(state[:, k], buf[k], queue[k], ids, lo, hi, missing[r], capacity)
        in_flight[k] = running
        if instant:
            _release(state[:, k], buf[k], queue[k], ids, lo, hi, missing[r], capacity)
        elif queue[k, _PINNED] > queue[k, _PEAK]:
            queue[k, _PEAK] = queue[k, _PINNED]
        n_running = _heap_push(finish, finishing, n_running, t + duration, r)
    return balance_routed, n_running


@nb.njit(cache=True, nogil=True)  # releases the GIL: replays can run in threads side by side
def _replay(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    prompt_tokens: I64,
    block_size: int,
    n_ids: int,
    arrival: I64,
    base_duration: I64,
    order: I64,
    starts: I64,
    routing: int,
    replicas: int,
    capacity: int,
    queue_size: int,
    instant: bool,
    replica_slots: int,
    timeout: int,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
    state: Any,
    buf: Any,
) -> tuple[I64, I64, int, I64, Any]:
    """Replay the streams ``order[starts[s]:starts[s+1]]``, each on fresh caches.

    ``FIXED``: stream k is replica k's (the caller assigned it); the replicas are independent
    caches, replayed one after another on one reused state row (``n_ids + queue_size`` int32),
    so memory does not grow with the replica count. ``LEAST_LOADED`` / ``CACHE_AWARE``: one
    stream of every request, and the router decides inside the loop with every replica's
    state live at once: ``replicas × (n_ids + queue_size)`` int32 (the caller checks the size).

    ``state`` (``n_ids × rows`` int32, block-major) and ``buf`` (``rows × queue_size`` int32) are
    scratch, ``rows`` 1 for ``FIXED`` and ``replicas`` otherwise: :func:`replay` allocates them.

    Returns per-request hit tokens and replica row chosen by the router (0 for ``FIXED``), how
    many requests the imbalance rule routed, per-replica peak pinned blocks and which requests
    ``timeout`` shed (the event loop's; the ``FIXED`` instant stream sheds none).
    """
    n = prompt_blocks.size
    hits = np.zeros(n, np.int64)
    chosen = np.zeros(n, np.int64)
    shed = np.zeros(n, np.bool_)
    rows = 1 if routing == FIXED else replicas
    queue = np.zeros((rows, _QUEUE_FIELDS), np.int64)
    peak = np.zeros(replicas, np.int64)
    balance_routed = 0
    for stream in range(starts.size - 1):
        state[:] = NOT_CACHED
        queue[:] = 0
        if routing == FIXED and instant:
            _instant_stream(
                offsets,
                ids,
                missing,
                hit_limit,
                block_size,
                order[starts[stream] : starts[stream + 1]],
                chosen,
                capacity,
                state,
                buf,
                queue,
                hits,
            )
            continue
        balance_routed += _event_loop(
            offsets,
            ids,
            prompt_blocks,
            missing,
            hit_limit,
            prompt_tokens,
            block_size,
            arrival,
            base_duration,
            order[starts[stream] : starts[stream + 1]],
            routing,
            capacity,
            instant,
            replica_slots,
            timeout,
            cache_threshold,
            balance_abs,
            balance_rel,
            state,
            buf,
            queue,
            hits,
            chosen,
            shed,
        )
        if routing == FIXED:
            peak[stream] = queue[0, _PEAK]
        else:
            peak[:] = queue[:, _PEAK]
    return hits, chosen, balance_routed, peak, shed


@nb.njit(cache=True, nogil=True)  # releases the GIL: replays can run in threads side by side
def _replay_chunk(
    offsets: I64,
    ids: Any,
    prompt_blocks: I64,
    missing: I64,
    hit_limit: I64,
    prompt_tokens: I64,
    block_size: int,
    arrival: I64,
    base_duration: I64,
    first: int,
    routing: int,
    capacity: int,
    instant: bool,
    replica_slots: int,
    timeout: int,
    cache_threshold: float,
    balance_abs: int,
    balance_rel: float,
    state: Any,
    buf: Any,
    queue: I64,
    chosen: I64,
    finish: I64,
    finishing: I64,
    n_running: int,
    in_flight: I64,
) -> tuple[I64, Any, int, int]:
    """One chunk of a replay that streams the workload, every replica's state live at once.

    Requests ``0..first-1`` are the ones still running from earlier chunks (their chains and
    replica ``chosen``: only their release is left; the heap ``finish``/``finishing`` holds
    them), requests ``first..`` the chunk's, replayed in order from the carried ``state``
    (``n_ids × replicas`` int32), free queues ``buf``/``queue`` and ``in_flight``, all updated
    in place: as :func:`_replay` would go on past the previous chunk. ``FIXED`` serves request
    ``r`` on replica ``chosen[r]``; the routers fill it. Returns per-request hit tokens and
    which requests ``timeout`` shed, how many the imbalance rule routed and the requests still
    running.
    """
    n = offsets.size - 1
    hits = np.zeros(n, np.int64)
    shed = np.zeros(n, np.bool_)
    order = np.arange(first, n)
    if routing == FIXED and instant:
        _instant_stream(
            offsets,
            ids,
            missing,
            hit_limit,
            block_size,
            order,
            chosen,
            capacity,
            state,
            buf,
            queue,
            hits,
        )
        return hits, shed, 0, n_running
    balance_routed, n_running = _event_steps(
        offsets,
        ids,
        prompt_blocks,
        missing,
        hit_limit,
        prompt_tokens,
        block_size,
        arrival,
        base_duration,
        order,
        routing,
        capacity,
        instant,
        replica_slots,
        timeout,
        cache_threshold,
        balance_abs,
        balance_rel,
        state,
        buf,
        queue,
        hits,
        chosen,
        shed,
        finish,
        finishing,
        n_running,
        in_flight,
    )
    return hits, shed, balance_routed, n_running


@nb.njit(cache=True)
def _gather_chains(offsets: I64, ids: Any, running: I64, pinned: bool) -> tuple[I64, Any]:
    """The chains of requests ``running`` (in that order) as CSR offsets and ids; empty chains
    when nothing is ``pinned`` (the instant lifetime: only their count in flight waits)."""
    out_offsets = np.zeros(running.size + 1, np.int64)
    if pinned:
        for i in range(running.size):
            r = running[i]
            out_offsets[i + 1] = out_offsets[i] + offsets[r + 1] - offsets[r]
    out = np.empty(out_offsets[-1], ids.dtype)
    for i in range(running.size):
        lo = offsets[running[i]]
        for j in range(out_offsets[i + 1] - out_offsets[i]):
            out[out_offsets[i] + j] = ids[lo + j]
    return out_offsets, out


# ---------------------------------------------------------------------------------------------
# Entry points: each kernel behind its check
# ---------------------------------------------------------------------------------------------


def guarded(kernel: Any, check: Callable[[str, dict[str, Any]], None]) -> Callable[..., Any]:
    """``kernel`` (a numba dispatcher named ``_<name>``) as ``<name>``: its arguments, bound to
    their names, go through ``check`` before numba runs; signature and docstring are the
    kernel's."""
    signature = inspect.signature(kernel.py_func)
    name = kernel.py_func.__name__.lstrip("_")

    @functools.wraps(kernel.py_func)
    def run(*args: Any, **kwargs: Any) -> Any:
        check(name, signature.bind(*args, **kwargs).arguments)
        return kernel(*args, **kwargs)

    run.__name__ = run.__qualname__ = name
    return run


def _check_is_chained(kernel: str, a: dict[str, Any]) -> None:
    check_chains(kernel, a["offsets"], a["ids"], a["n_ids"])


def _check_fnv1a_strings(kernel: str, a: dict[str, Any]) -> None:
    offsets, data = a["offsets"], a["data"]
    require(
        offsets.ndim == 1
        and offsets.size >= 1
        and int(offsets[0]) >= 0
        and int(offsets[-1]) <= data.size
        and bool((np.diff(offsets) >= 0).all()),
        kernel,
        f"offsets must rise within the {data.size} bytes",
    )


def _check_least_served(kernel: str, a: dict[str, Any]) -> None:
    check_replicas(kernel, a["replicas"])


def _check_bounded_affinity(kernel: str, a: dict[str, Any]) -> None:
    check_replica_indices(kernel, a["home"], a["replicas"])
    margin = a["margin"]
    require(np.isfinite(margin) and margin >= 0, kernel, f"margin {margin} is not ≥ 0")


def _check_group_by_replica(kernel: str, a: dict[str, Any]) -> None:
    check_replica_indices(kernel, a["replica"], a["replicas"])


def _check_replay(kernel: str, a: dict[str, Any]) -> None:
    per_request = ("prompt_blocks", "missing", "hit_limit", "prompt_tokens", "arrival")
    lengths = check_chains(
        kernel,
        a["offsets"],
        a["ids"],
        a["n_ids"],
        **{name: a[name] for name in per_request},
        base_duration=a["base_duration"],
    )
    check_blocks(kernel, lengths, a["missing"], a["hit_limit"])
    prompt_blocks = a["prompt_blocks"]
    require(
        bool(((prompt_blocks >= 0) & (prompt_blocks <= lengths)).all()),
        kernel,
        "prompt_blocks must lie between 0 and each request's chain length",
    )
    routing, replicas = a["routing"], a["replicas"]
    require(routing in (FIXED, LEAST_LOADED, CACHE_AWARE), kernel, f"unknown routing {routing}")
    check_replicas(kernel, replicas)
    # FIXED replays one stream per replica on one reused row; the others one stream of all
    streams = replicas if routing == FIXED else 2**62
    check_streams(kernel, a["order"], a["starts"], lengths.size, streams)
    for name, low, high, unit in (
        ("block_size", 1, INT32_LIMIT, ""),
        ("capacity", 0, 2**62, " blocks"),
        ("queue_size", 1, INT32_LIMIT, ""),
        ("replica_slots", 0, INT32_LIMIT, ""),
        ("timeout", 0, MAX_DURATION_US, " µs"),
    ):
        value = a[name]
        require(
            low <= value <= high, kernel, f"{name} must lie in {low:,}..{high:,}{unit}, got {value}"
        )
    rows = 1 if routing == FIXED else replicas
    state_bytes = rows * (a["n_ids"] + a["queue_size"]) * 4
    require(
        state_bytes <= MAX_STATE_BYTES,
        kernel,
        f"{state_bytes / 2**30:.1f} GiB of block state is above MAX_STATE_BYTES",
    )
    if lengths.size:
        durations, arrival = a["base_duration"], a["arrival"]
        require(
            int(durations.min()) >= 0 and int(durations.max()) <= MAX_DURATION_US,
            kernel,
            "durations must lie in 0..2^61 µs",
        )
        require(
            int(np.abs(arrival).max()) <= MAX_DURATION_US,
            kernel,
            "arrivals must lie within ±2^61 µs",
        )


def _check_least_served_from(kernel: str, a: dict[str, Any]) -> None:
    served = a["served"]
    require(served.ndim == 1 and served.size >= 1, kernel, "served needs one count a replica")


def _check_bounded_affinity_from(kernel: str, a: dict[str, Any]) -> None:
    _check_least_served_from(kernel, a)
    _check_bounded_affinity(kernel, {**a, "replicas": a["served"].size})
    require(a["start"] >= 0, kernel, f"start must be ≥ 0, got {a['start']}")


def check_replica_state(kernel: str, state: Any, buf: Any, queue: Any) -> None:
    """Carried block state (``n_ids × replicas`` int32), free queues (``replicas × size``
    int32) and queue records (``replicas × 5``): shapes agree, every queue's live window lies
    in its buffer and every block entry in it names a block of ``state``. The states
    themselves are not scanned (a pass over every block a chunk): the kernels compare a free
    block's queue position, never index with it."""
    require(
        state.ndim == 2 and buf.ndim == 2 and state.dtype == np.int32 and buf.dtype == np.int32,
        kernel,
        "state and buf must be 2-D int32",
    )
    replicas = state.shape[1]
    require(
        replicas >= 1
        and buf.shape[0] == replicas
        and buf.shape[1] >= 1
        and queue.shape == (replicas, _QUEUE_FIELDS),
        kernel,
        f"state ({state.shape}), buf ({buf.shape}) and queue ({queue.shape}) disagree on replicas",
    )
    require(1 <= state.shape[0] <= INT32_LIMIT, kernel, "state needs 1..2^31-1 block rows")
    head, tail = queue[:, _HEAD], queue[:, _TAIL]
    require(
        bool(((head >= 0) & (head <= tail) & (tail <= buf.shape[1])).all()),
        kernel,
        "queue head and tail must lie within the free queue",
    )
    for k in range(replicas):
        live = buf[k, head[k] : tail[k]]
        require(
            not live.size or int(live.max()) < state.shape[0],
            kernel,
            f"free queue {k} names a block past the {state.shape[0]} of state",
        )


def _check_gather_chains(kernel: str, a: dict[str, Any]) -> None:
    offsets, running = a["offsets"], a["running"]
    check_chains(kernel, offsets, a["ids"], INT32_LIMIT)
    if running.size:
        n = offsets.size - 1
        require(
            int(running.min()) >= 0 and int(running.max()) < n,
            kernel,
            f"running must hold request indices 0..{n - 1}",
        )


def _check_replay_chunk(kernel: str, a: dict[str, Any]) -> None:
    state, buf, queue = a["state"], a["buf"], a["queue"]
    check_replica_state(kernel, state, buf, queue)
    per_request = ("prompt_blocks", "missing", "hit_limit", "prompt_tokens", "arrival", "chosen")
    offsets, first = a["offsets"], a["first"]
    require(0 <= first < offsets.size, kernel, f"first must lie in 0..{offsets.size - 1}")
    # the carried requests' blocks were checked in the chunk they came with (and the state
    # only gains rows): a chunk checks its own, not every running request's again
    lengths = check_chains(
        kernel,
        offsets,
        a["ids"],
        state.shape[0],
        int(offsets[first]),
        **{name: a[name] for name in per_request},
        base_duration=a["base_duration"],
    )
    check_blocks(kernel, lengths, a["missing"], a["hit_limit"])
    prompt_blocks = a["prompt_blocks"]
    require(
        bool(((prompt_blocks >= 0) & (prompt_blocks <= lengths)).all()),
        kernel,
        "prompt_blocks must lie between 0 and each request's chain length",
    )
    routing, replicas = a["routing"], state.shape[1]
    require(routing in (FIXED, LEAST_LOADED, CACHE_AWARE), kernel, f"unknown routing {routing}")
    check_replica_indices(kernel, a["chosen"], replicas)
    n, n_running = lengths.size, a["n_running"]
    finish, finishing, in_flight = a["finish"], a["finishing"], a["in_flight"]
    require(
        finish.shape == finishing.shape
        and finish.ndim == 1
        and 0 <= n_running <= first
        and finish.size >= n_running + n - first,
        kernel,
        f"the heap needs room for its {n_running} running and {n - first} new requests",
    )
    running = finishing[:n_running]
    require(
        not running.size or (int(running.min()) >= 0 and int(running.max()) < first),
        kernel,
        f"running requests must be among the first {first}",
    )
    require(in_flight.shape == (replicas,), kernel, "in_flight needs one count a replica")
    for name, low, high in (
        ("block_size", 1, INT32_LIMIT),
        ("capacity", 0, 2**62),
        ("replica_slots", 0, INT32_LIMIT),
        ("timeout", 0, MAX_DURATION_US),
    ):
        value = a[name]
        require(low <= value <= high, kernel, f"{name} must lie in {low:,}..{high:,}, got {value}")
    state_bytes = (state.size + buf.size) * 4
    require(
        state_bytes <= MAX_STATE_BYTES,
        kernel,
        f"{state_bytes / 2**30:.1f} GiB of block state is above MAX_STATE_BYTES",
    )
    if n:
        durations, arrival = a["base_duration"], a["arrival"]
        require(
            int(durations.min()) >= 0 and int(durations.max()) <= MAX_DURATION_US,
            kernel,
            "durations must lie in 0..2^61 µs",
        )
        require(
            int(np.abs(arrival).max()) <= MAX_DURATION_US,
            kernel,
            "arrivals must lie within ±2^61 µs",
        )


is_chained = guarded(_is_chained, _check_is_chained)
fnv1a_strings = guarded(_fnv1a_strings, _check_fnv1a_strings)
least_served = guarded(_least_served, _check_least_served)
bounded_affinity = guarded(_bounded_affinity, _check_bounded_affinity)
group_by_replica = guarded(_group_by_replica, _check_group_by_replica)
least_served_from = guarded(_least_served_from, _check_least_served_from)
bounded_affinity_from = guarded(_bounded_affinity_from, _check_bounded_affinity_from)
replay_chunk = guarded(_replay_chunk, _check_replay_chunk)
gather_chains = guarded(_gather_chains, _check_gather_chains)
_REPLAY_SIGNATURE = inspect.signature(_replay.py_func)
_REPLAY_PARAMETERS = _REPLAY_SIGNATURE.replace(
    parameters=list(_REPLAY_SIGNATURE.parameters.values())[:-2]  # all but the scratch
)


def replay(*args: Any, **kwargs: Any) -> tuple[I64, I64, int, I64, Flags]:
    """:func:`_replay` behind its check, its scratch allocated here by numpy: numpy asks for
    transparent huge pages on large arrays (numba's allocator does not), and the replay reads
    and writes its block state at random, where huge pages save TLB misses."""
    a = _REPLAY_PARAMETERS.bind(*args, **kwargs).arguments
    _check_replay("replay", a)
    rows = 1 if a["routing"] == FIXED else a["replicas"]
    state = np.empty((a["n_ids"], rows), np.int32)
    buf = np.empty((rows, a["queue_size"]), np.int32)
    result: tuple[I64, I64, int, I64, Flags] = _replay(*a.values(), state, buf)  # type: ignore[call-arg]
    return result


replay.__signature__ = _REPLAY_PARAMETERS  # type: ignore[attr-defined]
