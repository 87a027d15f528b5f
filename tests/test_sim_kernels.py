"""The replay kernel against the pure-Python references on random tries, and the one-pass curve
kernel against the block-level stack-depth oracle (perf/sim_oracles.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from perf.sim_oracles import (
    ReferenceRun,
    event_reference,
    lru_reference,
    stack_depth_histogram_exact,
)
from pipeline.prefix.cache_rules import hit_limit_blocks
from pipeline.sim import curve_kernels, kernels

I64 = NDArray[np.int64]
B = 4


class Workload:
    """Requests whose chains are root paths of one random trie (a proper hash-chain workload).

    Each request takes a random prefix of an earlier request's chain (or nothing) and extends
    it with fresh blocks; prompt blocks, prompt tokens, unknown output blocks, arrivals and
    durations are random (durations long enough that several requests overlap).
    """

    def __init__(self, seed: int, n: int, *, max_new: int = 6, max_missing: int = 3) -> None:
        rng = np.random.default_rng(seed)
        chains: list[list[int]] = []
        next_id = 0
        for _ in range(n):
            base: list[int] = []
            if chains and rng.random() < 0.8:
                parent = chains[int(rng.integers(len(chains)))]
                base = parent[: int(rng.integers(0, len(parent) + 1))]
            grow = int(rng.integers(0, max_new + 1))
            chains.append(base + list(range(next_id, next_id + grow)))
            next_id += grow
        self.chains = chains
        lens = np.array([len(c) for c in chains], np.int64)
        self.offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=self.offsets[1:])
        self.ids = np.array([b for c in chains for b in c], np.int64)
        self.prompt_blocks = np.array([int(rng.integers(0, ln + 1)) for ln in lens], np.int64)
        self.prompt_tokens = self.prompt_blocks * B + rng.integers(0, 2 * B, n)
        self.prompt_tokens[rng.random(n) < 0.05] = 0
        self.prompt_blocks[self.prompt_tokens == 0] = 0
        self.missing = rng.integers(0, max_missing + 1, n).astype(np.int64)
        self.n_ids = max(next_id, 1)
        self.arrival = np.cumsum(rng.integers(0, 5, n)).astype(np.int64)
        self.duration = rng.integers(0, 25, n).astype(np.int64)
        self.limit = np.minimum(hit_limit_blocks(self.prompt_tokens, B), self.prompt_blocks)

    @property
    def n(self) -> int:
        return int(self.prompt_blocks.size)

    def common(self) -> tuple[object, ...]:
        return (
            self.offsets,
            self.ids,
            self.prompt_blocks,
            self.missing,
            self.limit,
            self.prompt_tokens,
            B,
            self.n_ids,
            self.arrival,
            self.duration,
        )

    def queue(self, capacity: int) -> int:
        """A free queue just over twice the live entries it may hold, so it compacts often."""
        distinct = self.n_ids + int(np.count_nonzero(self.missing))
        return 2 * (min(capacity, distinct) + int(np.diff(self.offsets).max()) + 1) + 8

    def reference_args(self) -> tuple[object, ...]:
        return (self.chains, self.prompt_blocks.tolist(), self.missing.tolist())

    def event_reference(self, capacity: int, **kw: Any) -> ReferenceRun:
        return event_reference(
            *self.reference_args(),
            self.prompt_tokens.tolist(),
            B,
            capacity,
            arrival=self.arrival.tolist(),
            duration=self.duration.tolist(),
            **kw,
        )


def fixed(
    w: Workload, order: I64, starts: I64, capacity: int, instant: bool, slots: int = 0
) -> tuple[I64, I64]:
    """The kernel on a fixed assignment: per-request hit tokens, per-replica peak pinned."""
    hits, _, balance, peak, _ = kernels.replay(
        *w.common(),
        order,
        starts,
        kernels.FIXED,
        starts.size - 1,
        capacity,
        w.queue(capacity),
        instant,
        slots,
        0,
        0.0,
        0,
        1.0,
    )
    assert balance == 0
    return hits, peak


def streams(replica: I64, replicas: int) -> tuple[I64, I64]:
    order = np.argsort(replica, kind="stable").astype(np.int64)
    starts = np.zeros(replicas + 1, np.int64)
    np.cumsum(np.bincount(replica, minlength=replicas), out=starts[1:])
    return order, starts


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("replicas", [1, 3])
def test_instant_replay_matches_an_ordered_dict_lru(seed: int, replicas: int) -> None:
    w = Workload(seed, 150)
    replica = np.random.default_rng(seed + 100).integers(0, replicas, w.n).astype(np.int64)
    order, starts = streams(replica, replicas)
    for capacity in [0, 1, 2, 3, 5, 8, 13, 21, 40, 80, 200, 10_000]:
        got, peak = fixed(w, order, starts, capacity, True)
        want = lru_reference(
            *w.reference_args(), w.prompt_tokens.tolist(), B, capacity, replica.tolist(), replicas
        )
        assert got.tolist() == want, capacity
        assert peak.tolist() == [0] * replicas  # nothing stays pinned


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lifetime", ["durations", "instant"])
@pytest.mark.parametrize("slots", [0, 2])
def test_fixed_assignment_replay_matches_the_event_reference(
    seed: int, lifetime: str, slots: int
) -> None:
    w = Workload(seed, 200)
    replicas = 3
    replica = np.random.default_rng(seed + 7).integers(0, replicas, w.n).astype(np.int64)
    order, starts = streams(replica, replicas)
    for capacity in [0, 2, 5, 13, 40, 10_000]:
        got, peak = fixed(w, order, starts, capacity, lifetime == "instant", slots)
        want = w.event_reference(
            capacity,
            replicas=replicas,
            replica=replica.tolist(),
            lifetime=lifetime,
            replica_slots=slots,
        )
        assert got.tolist() == want.hit_tokens, capacity
        if lifetime == "durations":
            assert peak.tolist() == want.peak_pinned_blocks, capacity


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lifetime", ["durations", "instant"])
@pytest.mark.parametrize("routing", [kernels.LEAST_LOADED, kernels.CACHE_AWARE])
def test_routed_replay_matches_the_event_reference(seed: int, lifetime: str, routing: int) -> None:
    w = Workload(seed, 200)
    replicas = 3
    for capacity, knobs in [(4, (0.5, 2, 1.1)), (30, (0.3, 1, 1.5)), (10_000, (0.5, 32, 1.1))]:
        hits, chosen, balance, peak, _ = kernels.replay(
            *w.common(),
            np.arange(w.n, dtype=np.int64),
            np.array([0, w.n], np.int64),
            routing,
            replicas,
            capacity,
            w.queue(capacity),
            lifetime == "instant",
            2,
            0,
            *knobs,
        )
        want = w.event_reference(
            capacity,
            replicas=replicas,
            routing="least-loaded" if routing == kernels.LEAST_LOADED else "cache-aware",
            lifetime=lifetime,
            replica_slots=2,
            cache_aware=knobs,
        )
        assert chosen.tolist() == want.replica, capacity
        assert hits.tolist() == want.hit_tokens, capacity
        assert balance == want.balance_routed
        if lifetime == "durations":
            assert peak.tolist() == want.peak_pinned_blocks


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("routing", [kernels.FIXED, kernels.LEAST_LOADED, kernels.CACHE_AWARE])
def test_requests_past_the_timeout_are_shed_as_the_reference_sheds_them(
    seed: int, routing: int
) -> None:
    """One slot a replica and a timeout of 30 µs against durations of 0-24 µs two apart: a
    request its replica would stretch past 30 is shed (no hits, no pinning, not in flight)."""
    w = Workload(seed, 200)
    replicas, capacity, timeout = 3, 13, 30
    replica = np.random.default_rng(seed).integers(0, replicas, w.n).astype(np.int64)
    order, starts = (
        streams(replica, replicas)
        if routing == kernels.FIXED
        else (np.arange(w.n, dtype=np.int64), np.array([0, w.n], np.int64))
    )
    hits, chosen, balance, peak, shed = kernels.replay(
        *w.common(),
        order,
        starts,
        routing,
        replicas,
        capacity,
        w.queue(capacity),
        False,
        1,
        timeout,
        0.5,
        2,
        1.1,
    )
    names = {kernels.FIXED: "fixed", kernels.LEAST_LOADED: "least-loaded"}
    want = w.event_reference(
        capacity,
        replicas=replicas,
        replica=replica.tolist(),
        routing=names.get(routing, "cache-aware"),
        replica_slots=1,
        timeout=timeout,
        cache_aware=(0.5, 2, 1.1),
    )
    assert shed.tolist() == want.shed
    assert 0 < shed.sum() < w.n
    assert hits.tolist() == want.hit_tokens and not hits[shed].any()
    assert peak.tolist() == want.peak_pinned_blocks
    if routing != kernels.FIXED:
        assert chosen.tolist() == want.replica and balance == want.balance_routed


def test_the_references_agree_with_each_other_in_the_instant_lifetime() -> None:
    w = Workload(3, 300)
    replica = [i % 2 for i in range(w.n)]
    for capacity in (3, 17, 500):
        plain = lru_reference(
            *w.reference_args(), w.prompt_tokens.tolist(), B, capacity, replica, 2
        )
        events = w.event_reference(
            capacity,
            replicas=2,
            replica=replica,
            lifetime="instant",
        )
        assert plain == events.hit_tokens


def curve_against_oracle(w: Workload, order: I64, starts: I64) -> I64:
    """The one-pass curve's steps must be the oracle histogram's nonzero depths and running
    sums; returns the histogram."""
    size = int(w.ids.size + w.missing.sum()) + 2
    caps, hit_tokens = curve_kernels.hit_steps_chained(
        w.offsets, w.ids, w.missing, w.limit, B, w.n_ids, order, starts, size
    )
    hist = stack_depth_histogram_exact(
        w.offsets,
        w.ids,
        w.missing,
        w.prompt_blocks,
        w.prompt_tokens,
        B,
        w.n_ids,
        order,
        starts,
        size,
    )
    depths = np.flatnonzero(hist)
    assert caps.tolist() == depths.tolist()
    assert hit_tokens.tolist() == np.cumsum(hist[depths]).tolist()
    return hist


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_curve_steps_equal_the_block_level_histogram(seed: int, replicas: int) -> None:
    w = Workload(seed, 400, max_missing=2)
    replica = np.random.default_rng(seed).integers(0, replicas, w.n).astype(np.int64)
    order, starts = streams(replica, replicas)
    hist = curve_against_oracle(w, order, starts)
    # and the histogram is the hit count of the instant replay at every capacity
    cumulative = np.cumsum(hist)
    for capacity in range(0, int(np.flatnonzero(hist).max(initial=0)) + 3):
        direct, _ = fixed(w, order, starts, capacity, True)
        assert int(direct.sum()) == int(cumulative[min(capacity, cumulative.size - 1)])


def test_long_gaps_use_the_fenwick_tree() -> None:
    # Many requests between two visits of a prefix: deep runs, many Fenwick levels.
    w = Workload(7, 3000, max_new=2)
    order = np.arange(w.n, dtype=np.int64)
    starts = np.array([0, w.n], np.int64)
    hist = curve_against_oracle(w, order, starts)
    assert int(np.flatnonzero(hist).max()) > 1000


def test_group_by_replica_is_a_stable_sort() -> None:
    replica = np.random.default_rng(3).integers(0, 5, 1000).astype(np.int64)
    order, starts = kernels.group_by_replica(replica, 6)
    assert order.tolist() == np.argsort(replica, kind="stable").tolist()
    assert starts.tolist() == [0, *np.cumsum(np.bincount(replica, minlength=6)).tolist()]


def test_replica_outside_the_range_is_refused() -> None:
    from pipeline.sim.blocks import SimulationInputError
    from pipeline.sim.replay import replica_streams

    with pytest.raises(SimulationInputError, match="replica index"):
        replica_streams(np.array([0, 2, 1], np.int64), 2)
