"""Independent references for the prefix-cache replay, used by the tests and ``perf.sim``.

- :func:`lru_reference`: the instant lifetime read literally: one OrderedDict LRU per replica,
  lookup, then every block of the request refreshed tail first, then LRU eviction to capacity.
- :func:`event_reference`: the event-driven rules read literally (ref counts, a free
  OrderedDict, releases in finish order, load-dependent durations, least-loaded and sgl-router
  cache-aware routing) in both lifetimes.
- :func:`stack_depth_histogram_exact`: token-weighted LRU stack depths at block level by a
  plain scan of the latest-access marks (no Fenwick tree), the oracle of the one-pass curves.

All three apply vLLM's hit rule themselves: at most ⌊(P − 1) / B⌋ leading prompt blocks hit.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]


def hit_limit(prompt_tokens: int, block_size: int) -> int:
    """Whole blocks below the last prompt token (vLLM recomputes the last token)."""
    return max(prompt_tokens - 1, 0) // block_size


def lru_reference(
    chains: Sequence[Sequence[Hashable]],
    prompt_blocks: Sequence[int],
    anonymous: Sequence[int],
    prompt_tokens: Sequence[int],
    block_size: int,
    capacity: int,
    replica: Sequence[int],
    replicas: int,
) -> list[int]:
    """Hit tokens per request of the instant lifetime: one OrderedDict LRU per replica."""
    caches: list[OrderedDict[Hashable, None]] = [OrderedDict() for _ in range(replicas)]
    out = []
    fresh = 0
    for i, chain in enumerate(chains):
        cache = caches[replica[i]]
        hit = 0
        for j in range(prompt_blocks[i]):
            if chain[j] not in cache:
                break
            hit += 1
        out.append(min(hit, hit_limit(prompt_tokens[i], block_size)) * block_size)
        for _ in range(anonymous[i]):  # unknown output blocks: unique, the tail, inserted first
            fresh -= 1
            cache[("anonymous", fresh)] = None
        for b in reversed(chain):
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return out


class _Replica:
    """One cache: pinned blocks with their ref counts, free blocks in release order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ref: dict[Hashable, int] = {}
        self.free: OrderedDict[Hashable, None] = OrderedDict()
        self.peak = 0

    def cached(self, block: Hashable) -> bool:
        return block in self.ref or block in self.free

    def leading(self, chain: Sequence[Hashable], blocks: int) -> int:
        h = 0
        while h < blocks and self.cached(chain[h]):
            h += 1
        return h

    def evict(self) -> None:
        while len(self.ref) + len(self.free) > self.capacity and self.free:
            self.free.popitem(last=False)

    def admit(self, blocks: Sequence[Hashable]) -> None:
        for b in blocks:
            if b in self.free:
                del self.free[b]
            self.ref[b] = self.ref.get(b, 0) + 1
        self.evict()

    def release(self, blocks_tail_first: Sequence[Hashable]) -> None:
        for b in blocks_tail_first:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                self.free[b] = None
        self.evict()


@dataclass
class ReferenceRun:
    hit_tokens: list[int]
    replica: list[int]
    balance_routed: int
    peak_pinned_blocks: list[int]
    shed: list[bool]


def event_reference(
    chains: Sequence[Sequence[Hashable]],
    prompt_blocks: Sequence[int],
    anonymous: Sequence[int],
    prompt_tokens: Sequence[int],
    block_size: int,
    capacity: int,
    *,
    arrival: Sequence[int],
    duration: Sequence[int],
    replicas: int = 1,
    replica: Sequence[int] | None = None,
    routing: str = "fixed",
    lifetime: str = "durations",
    replica_slots: int | None = None,
    timeout: int = 0,
    cache_aware: tuple[float, int, float] = (0.5, 32, 1.1),
) -> ReferenceRun:
    """The event-driven replay, read literally (see pipeline/sim/kernels.py for the rules).

    ``routing``: ``fixed`` (``replica`` given), ``least-loaded`` or ``cache-aware``;
    ``lifetime``: ``durations`` or ``instant``; ``timeout`` > 0 sheds a request whose
    duration, stretched past the slots, exceeds it. Requests must be in arrival order.
    """
    caches = [_Replica(capacity) for _ in range(replicas)]
    running: list[tuple[int, int]] = []  # (finish, request): ties go to the lower index
    in_flight = [0] * replicas
    chosen: list[int] = []
    hits: list[int] = []
    shed: list[bool] = []
    balance_routed = 0
    threshold, balance_abs, balance_rel = cache_aware

    def blocks(i: int) -> list[Hashable]:
        return [*chains[i], *[("anonymous", i, a) for a in range(anonymous[i])]]

    def tail_first(i: int) -> list[Hashable]:
        return [*[("anonymous", i, a) for a in range(anonymous[i])], *reversed(chains[i])]

    def lightest() -> int:
        return min(range(replicas), key=lambda q: (in_flight[q], q))

    for i in range(len(chains)):
        while running and running[0][0] <= arrival[i]:
            _, done = heapq.heappop(running)
            in_flight[chosen[done]] -= 1
            if lifetime == "durations":
                caches[chosen[done]].release(tail_first(done))
        if routing == "fixed":
            assert replica is not None
            k = replica[i]
        elif routing == "least-loaded":
            k = lightest()
        else:
            if (
                max(in_flight) - min(in_flight) > balance_abs
                and max(in_flight) > min(in_flight) * balance_rel
            ):
                k = lightest()
                balance_routed += 1
            else:
                matched = [c.leading(chains[i], prompt_blocks[i]) for c in caches]
                best = min(range(replicas), key=lambda q: (-matched[q], in_flight[q], q))
                rate = matched[best] * block_size / prompt_tokens[i] if prompt_tokens[i] else 0.0
                k = best if rate > threshold else lightest()
        chosen.append(k)
        d = duration[i]
        if replica_slots and in_flight[k] + 1 > replica_slots:
            d = d * (in_flight[k] + 1) // replica_slots
            if timeout and d > timeout:
                shed.append(True)
                hits.append(0)
                continue
        shed.append(False)
        cache = caches[k]
        h = cache.leading(chains[i], prompt_blocks[i])
        hits.append(min(h, hit_limit(prompt_tokens[i], block_size)) * block_size)
        cache.admit(blocks(i))
        in_flight[k] += 1
        if lifetime == "instant":
            cache.release(tail_first(i))
        else:
            cache.peak = max(cache.peak, len(cache.ref))
        heapq.heappush(running, (arrival[i] + d, i))
    return ReferenceRun(hits, chosen, balance_routed, [c.peak for c in caches], shed)


@nb.njit(cache=True)
def _depths_stream(
    offsets: I64,
    ids: Any,
    missing: I64,
    limit: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    hist: I64,
) -> None:
    total = 0
    for i in range(order.size):
        r = order[i]
        total += missing[r] + offsets[r + 1] - offsets[r]
    latest = np.zeros(total + 1, np.bool_)  # position holds some block's latest access
    last = np.full(n_ids, -1, np.int64)
    top = hist.size - 1
    t = 0
    for i in range(order.size):
        r = order[i]
        lo = offsets[r]
        for j in range(limit[r]):
            p = last[ids[lo + j]]
            if p < 0:
                break
            depth = 1
            for q in range(p + 1, t):
                if latest[q]:
                    depth += 1
            hist[min(depth, top)] += block_size
        for _ in range(missing[r]):
            latest[t] = True
            t += 1
        for j in range(offsets[r + 1] - 1, lo - 1, -1):
            b = ids[j]
            if last[b] >= 0:
                latest[last[b]] = False
            latest[t] = True
            last[b] = t
            t += 1


def stack_depth_histogram_exact(
    offsets: I64,
    ids: Any,
    missing: I64,
    prompt_blocks: I64,
    prompt_tokens: I64,
    block_size: int,
    n_ids: int,
    order: I64,
    starts: I64,
    hist_size: int,
) -> I64:
    """Token-weighted LRU stack depths at lookup, summed over the replicas' streams.

    Accesses are each request's anonymous blocks, then its chain tail first; a lookup walks the
    prompt's chain until the first block never accessed before, and block j (j < hit limit)
    adds B tokens at depth 1 + (latest accesses of distinct blocks since its own).
    """
    limit = np.minimum(np.maximum(prompt_tokens - 1, 0) // block_size, prompt_blocks)
    hist = np.zeros(hist_size, np.int64)
    for k in range(starts.size - 1):
        _depths_stream(
            offsets,
            ids,
            missing,
            limit.astype(np.int64),
            block_size,
            n_ids,
            order[starts[k] : starts[k + 1]],
            hist,
        )
    return hist
