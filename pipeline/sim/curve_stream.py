"""Capacity curves of a table too large to flatten: a SHARDS sample kept while reading it.

The exact curves (:func:`pipeline.sim.curve.capacity_curve`) number every block of the whole
table first. Above ``simulation.curve_exact_max_blocks`` stored blocks this module reads the
request parts one at a time instead (they are in arrival order), flattens each part alone
(:func:`pipeline.sim.blocks.sim_input`: the same checks), strides its chains to each block size,
keys every block by (cache namespace, chained hash) and keeps only the blocks whose key passes
the SHARDS filter ``splitmix64(key ^ salt) ≤ rate · 2^64`` (spatial sampling, Waldspurger et al.,
"Efficient MRC Construction with SHARDS", FAST 2015): a block is in or out of the sample for
the whole trace, so the sample's reuse distances are the trace's scaled by the rate. Memory
follows the sampled blocks and the requests that hold one, not the table. The sampled depths
are scaled by 1/rate and the hits normalised by every prompt block's hit weight (a ratio
estimator: :func:`pipeline.sim.curve.sampled_steps`).

The error is estimated on the trace itself (``hit_ratio_error``), as the larger of: the largest
hit-ratio gap between the sample's curve and each of its two independent halves' (key hash
≤ rate/2 · 2^64, or above: each a SHARDS sample at half the rate), and the relative gap between
the sampled lookups' weight scaled by 1/rate and every prompt block's (a sample that missed the
few hot blocks carrying most hits shows it there, where the halves agree). It is an estimate,
not a bound; ``tests/test_sim_curve_sampled.py`` checks the sampled curve and the estimate
against the exact curve on a generated several-day workload (docs/simulation-curves.md).

Each curve's replicas are assigned while reading, a part at a time, by the router the streamed
scenarios use (:class:`pipeline.sim.stream.Router`: round-robin, random, least-served, affinity,
bounded-affinity, their counters carried; the affinities' sessions logged or inferred per
part, :class:`pipeline.sim.stream.Sessions`). Least-loaded needs the
replay's event loop over the whole table, so with such a curve configured the table is
flattened once (:func:`pipeline.sim.replay.assign`) and sampled from memory, with the same
sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from numpy.typing import NDArray

from pipeline.prefix.cache_rules import NAMESPACE_COLUMNS
from pipeline.prefix.hashmap import DenseNumbering, splitmix64
from pipeline.prefix.replay import power_of_two_rate
from pipeline.shape.facts import LatencyModel
from pipeline.sim import curve_kernels
from pipeline.sim.blocks import (
    ContentCoverage,
    SimInputs,
    SimulationInputError,
)
from pipeline.sim.config import CACHE_INDEPENDENT, MIN_SAMPLE_RATE, SimConfig
from pipeline.sim.curve import (
    Curve,
    require_single_pass,
    sample_threshold,
    sampled_steps,
)
from pipeline.sim.replay import assign, replica_streams
from pipeline.sim.stream import (
    RequestChunks,
    Router,
    Sessions,
    StreamOrder,
    TableFacts,
    flattened_after,
    part_chunks,
    routes_by_session,
)

I64 = NDArray[np.int64]
U64 = NDArray[np.uint64]

# The SHARDS filter's salt: fixed, so the same table gives the same sampled curve.
SAMPLE_SALT = 0x5EED_C0DE_5A3D_5A17
# Routings a curve assigns while the table is read (:class:`pipeline.sim.stream.Router`, as the
# streamed scenarios do); least-loaded needs the replay's event loop over the whole table.
STREAMED_ROUTINGS = CACHE_INDEPENDENT - {"least-loaded"}

Combination = tuple[int, int, str]  # block size, replicas, routing


def stored_blocks(parts: Iterable[Path]) -> int:
    """Stored blocks of the request parts (every request's ``prefix_hashes`` entries), from their
    Parquet metadata: no data is read. A row without a chain counts one slot (its empty or null
    list), a slight overcount."""
    total = 0
    for part in parts:
        meta = pq.ParquetFile(part).metadata
        leaf = (
            [
                j
                for j in range(meta.num_columns)
                if meta.row_group(0).column(j).path_in_schema.split(".")[0] == "prefix_hashes"
            ]
            if meta.num_row_groups
            else []
        )
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            total += sum(group.column(j).num_values for j in leaf)
    return total


def streamable(combinations: Sequence[Combination]) -> bool:
    """Whether every curve's assignment can be drawn while the table is read."""
    return all(r == 1 or routing in STREAMED_ROUTINGS for _, r, routing in combinations)


@dataclass
class _Sample:
    """One block size's sample, gathered part by part: the sampled keys and, per kept request
    (one with a sampled block or unknown output block, in arrival order), its counts (a row of
    :func:`pipeline.sim.curve_kernels.sample_chains`' columns)."""

    block_size: int
    numbering: DenseNumbering = field(default_factory=DenseNumbering)
    ids: list[NDArray[np.int32]] = field(default_factory=list)  # the sampled keys, numbered
    in_half: list[NDArray[np.bool_]] = field(default_factory=list)
    counts: list[NDArray[np.int32]] = field(default_factory=list)
    prompt_weight: int = 0  # every request's hit-limit blocks × block size
    anon: np.uint64 = field(default_factory=lambda: np.uint64(0))


@dataclass
class _Gathered:
    n: int = 0
    content_requests: int = 0
    content_tokens: int = 0
    prompt_tokens: int = 0
    namespaces: dict[tuple[object, ...], int] = field(default_factory=dict)


class CurveSampler:
    """The sample of every configured block size and the replicas of every curve, fed one
    flattened part at a time in arrival order (:meth:`add`), then the curves (:meth:`curves`)."""

    def __init__(
        self, settings: SimConfig, combinations: Sequence[Combination], rate: float
    ) -> None:
        if not 0 < rate <= 1:
            raise SimulationInputError(f"a sampled curve's rate must lie in (0, 1], got {rate}")
        self.settings = settings
        self.combinations = list(combinations)
        self.rate = rate
        self.threshold = sample_threshold(self.rate)
        self.half = self.threshold // np.uint64(2)
        self.salt = np.uint64(SAMPLE_SALT)
        self.samples = {bs: _Sample(bs) for bs in dict.fromkeys(c[0] for c in combinations)}
        # each multi-replica curve's replica per kept request (one replica needs none)
        self.replicas: dict[Combination, list[NDArray[np.int32]]] = {
            c: [] for c in self.combinations if c[1] > 1
        }
        self.seen = _Gathered()

    def _namespace_mix(self, part: SimInputs, whole: bool) -> U64:
        """Per request, what its block hashes are xor-ed with to key them by namespace: 0 for
        the table's first namespace (so one namespace samples the hashes themselves), else a
        mixed code numbered in order of first appearance over the whole table."""
        isolated = self.settings.tenant_isolation
        names = [*NAMESPACE_COLUMNS, *(("tenant",) if isolated else ())]
        source = part.tenant_source
        codes = part.namespace_isolated if isolated else part.namespace
        if whole:  # the whole table: its codes are already the table's
            return _mixed(np.arange(int(codes.max(initial=0)) + 1, dtype=np.uint64))[codes]
        if source is None:
            raise ValueError("the part's namespace columns were already released")
        distinct = source.select(pl.col(c).cast(pl.String) for c in names)
        if all(distinct[c].null_count() == distinct.height for c in names):
            local = [tuple(None for _ in names)]
        else:
            local = distinct.unique(maintain_order=True).rows()
        table = self.seen.namespaces
        global_codes = np.array(
            [table.setdefault(key, len(table)) for key in local], dtype=np.uint64
        )
        return _mixed(global_codes)[codes]

    def add(self, part: SimInputs, assignments: dict[Combination, I64], *, whole: bool) -> None:
        """Sample one part (the next requests in arrival order, or the ``whole`` table);
        ``assignments`` gives each multi-replica curve's replica per request of the part."""
        seen = self.seen
        mix = self._namespace_mix(part, whole=whole)
        stored_lengths = np.diff(part.offsets)
        for bs, sample in self.samples.items():
            m = part.stride(bs)
            _, missing, hit_limit = part.request_blocks(bs, stored_lengths // m)
            keys, in_half, counts, sample.anon = curve_kernels.sample_chains(
                part.offsets,
                part.hashes,
                m,
                mix,
                hit_limit,
                missing,
                self.threshold,
                self.half,
                self.salt,
                sample.anon,
            )
            kept = np.flatnonzero(
                counts[:, curve_kernels.SAMPLED] + counts[:, curve_kernels.MISSING] > 0
            )
            sample.ids.append(sample.numbering.number(keys))
            del keys
            sample.in_half.append(in_half)
            sample.counts.append(counts[kept])
            sample.prompt_weight += int(hit_limit.sum()) * bs
            for combo, replicas in self.replicas.items():
                if combo[0] == bs:
                    replicas.append(assignments[combo][kept].astype(np.int32))
        seen.n += part.n
        coverage = part.coverage()
        seen.content_requests += coverage.requests
        seen.content_tokens += coverage.prompt_tokens
        seen.prompt_tokens += int(part.prompt_tokens.sum())

    def coverage(self) -> ContentCoverage:
        seen = self.seen
        share = seen.content_tokens / seen.prompt_tokens if seen.prompt_tokens else None
        return ContentCoverage(seen.content_requests, seen.content_tokens, share)

    def curves(self) -> list[Curve]:
        coverage = self.coverage()
        out = []
        for bs, sample in self.samples.items():
            ids = _drained(sample.ids, np.int32)
            in_half = _drained(sample.in_half, np.bool_)
            counts = _drained(sample.counts, np.int32, (6,))
            n_ids = sample.numbering.count
            sample.numbering = DenseNumbering()  # its table let go of
            combos = [c for c in self.combinations if c[0] == bs]
            replicas = {
                c: _drained(self.replicas.pop(c), np.int32) for c in combos if c in self.replicas
            }
            rates = (
                self.rate,
                (float(self.half) + 1.0) / 2.0**64,
                (float(self.threshold) - float(self.half)) / 2.0**64,
            )
            # one sample's arrays at a time (the whole, then each half), the curves of every
            # combination from it: the halves are copies of part of the whole's blocks
            steps: dict[Combination, list[tuple[I64, I64, float]]] = {c: [] for c in combos}
            for which, rate in enumerate(rates):
                arrays = _sample_arrays(ids, in_half, counts, which)
                for combo in combos:
                    replica = replicas.get(combo)
                    weight = sample.prompt_weight
                    steps[combo].append(
                        _steps(arrays, max(n_ids, 1), bs, replica, combo[1], rate, weight)
                    )
                del arrays
            for combo in combos:
                out.append(self._curve(combo, steps[combo], coverage, n_ids))
        return out

    def _curve(
        self,
        combo: Combination,
        steps: list[tuple[I64, I64, float]],
        coverage: ContentCoverage,
        n_ids: int,
    ) -> Curve:
        """The curve of ``combo`` from its three samples' steps (the whole, each half)."""
        bs, replicas, routing = combo
        empty = None
        if n_ids == 0 and coverage.reason is None:
            empty = (
                f"the {self.rate:.4%} sample of blocks kept none of the trace's blocks; "
                "raise simulation.curve_sample_rate (or curve_exact_max_blocks)"
            )
        known = coverage.reason is None and empty is None
        gaps = [_largest_gap(steps[0][:2], h[:2], coverage.prompt_tokens) for h in steps[1:]]
        error = max(*gaps, steps[0][2]) if known else None
        return Curve(
            block_size=bs,
            replicas=replicas,
            routing=routing if replicas > 1 else "single",
            tenant_isolation=self.settings.tenant_isolation,
            prompt_tokens=self.seen.prompt_tokens,
            capacity_blocks=steps[0][0],
            hit_tokens=steps[0][1],
            coverage=coverage,
            sample_rate=float(self.rate),
            hit_ratio_error=error,
            sample_reason=empty,
        )


def _mixed(codes: U64) -> U64:
    """What a namespace's block hashes are xor-ed with: 0 for the first, else its mixed code."""
    return np.array(
        [0 if c == 0 else int(splitmix64(np.uint64(c))) for c in codes.tolist()], np.uint64
    )


def _drained(arrays: list[NDArray[Any]], dtype: type, row: tuple[int, ...] = ()) -> NDArray[Any]:
    """``arrays`` concatenated, each let go of once copied (the list is emptied), so the
    whole is held once, not twice."""
    out: NDArray[Any] = np.empty((sum(len(a) for a in arrays), *row), dtype)
    at = 0
    while arrays:
        piece = arrays.pop(0)
        out[at : at + len(piece)] = piece
        at += len(piece)
    return out


Arrays = tuple[I64, NDArray[np.integer], NDArray[np.int32], NDArray[np.int32]]
# offsets, ids, missing, hit limit


def _sample_arrays(
    ids: NDArray[np.integer], in_half: NDArray[np.bool_], counts: NDArray[np.int32], which: int
) -> Arrays:
    """The kept requests' chains of the whole sample (``which`` 0) or of its first (1) or
    second (2) half, from :func:`curve_kernels.sample_chains`' per-request counts."""

    def column(j: int) -> NDArray[np.int32]:
        return np.ascontiguousarray(counts[:, j])

    if which == 0:
        length, limit = column(curve_kernels.SAMPLED), column(curve_kernels.SAMPLED_HITTABLE)
        missing, chosen = column(curve_kernels.MISSING), ids
    elif which == 1:
        length, limit = column(curve_kernels.HALF), column(curve_kernels.HALF_HITTABLE)
        missing, chosen = column(curve_kernels.MISSING_HALF), ids[in_half]
    else:
        length = column(curve_kernels.SAMPLED) - column(curve_kernels.HALF)
        limit = column(curve_kernels.SAMPLED_HITTABLE) - column(curve_kernels.HALF_HITTABLE)
        missing, chosen = (
            column(curve_kernels.MISSING) - column(curve_kernels.MISSING_HALF),
            ids[~in_half],
        )
    offsets = np.zeros(length.size + 1, np.int64)
    np.cumsum(length, out=offsets[1:])
    return offsets, chosen, missing, limit


def _steps(
    arrays: Arrays,
    n_ids: int,
    block_size: int,
    replica: NDArray[np.int32] | None,
    replicas: int,
    rate: float,
    prompt_weight: int,
) -> tuple[I64, I64, float]:
    """The curve's steps from one sample: the depth histogram of the sampled blocks (every one
    kept, the filter already applied) on each replica's requests (``replica`` per request;
    None for one replica), depths scaled by 1/rate as the in-memory SHARDS kernel scales them,
    then the ratio estimator; and the relative gap between the sampled lookups' weight (scaled
    by 1/rate) and every prompt block's."""
    offsets, ids, missing, limit = arrays
    n = offsets.size - 1
    per_request = np.diff(offsets) + missing
    if replica is None:
        order, starts = np.arange(n, dtype=np.int64), np.array([0, n], np.int64)
        accesses = np.array([per_request.sum()], np.float64)
        unknown = np.array([missing.sum()], np.float64)
    else:
        order, starts = replica_streams(replica, replicas)
        accesses = np.bincount(replica, per_request, replicas).astype(np.float64, copy=False)
        unknown = np.bincount(replica, missing, replicas).astype(np.float64, copy=False)
    del per_request
    bound = np.minimum(accesses, n_ids + unknown)
    hist_size = max(2, int(bound.max()) + 2 if bound.size else 2)
    every = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
    hist = curve_kernels.stack_depth_histogram(
        offsets,
        ids,
        missing,
        limit,
        block_size,
        n_ids,
        order,
        starts,
        every,
        np.uint64(0),
        hist_size,
    )
    depth = np.flatnonzero(hist[1:]) + 1
    capacity, group = np.unique((depth * (1.0 / rate) + 0.5).astype(np.int64), return_inverse=True)
    weight = np.bincount(group, weights=hist[depth], minlength=capacity.size).astype(np.float64)
    caps, hits = sampled_steps(capacity, weight, float(hist[0]), float(prompt_weight))
    # the sampled lookups' weight, scaled, against every prompt block's: how far the sample's
    # mix of blocks is from the trace's
    missed = abs(float(hist[0]) / rate - prompt_weight) / prompt_weight if prompt_weight else 0.0
    return caps, hits, missed


def _largest_gap(a: tuple[I64, I64], b: tuple[I64, I64], prompt_tokens: int) -> float:
    """Largest hit-ratio difference between two step curves at any capacity."""
    capacities = np.union1d(a[0], b[0])
    if capacities.size == 0 or prompt_tokens == 0:
        return 0.0

    def at(curve: tuple[I64, I64]) -> NDArray[np.float64]:
        i = np.searchsorted(curve[0], capacities, side="right") - 1
        return np.where(i >= 0, curve[1][np.maximum(i, 0)], 0).astype(np.float64)

    return float(np.abs(at(a) - at(b)).max() / prompt_tokens)


def sample_rate(settings: SimConfig, blocks: int) -> float:
    """The rate of a table of ``blocks`` stored blocks: ``simulation.curve_sample_rate``, else
    the power of two (1/2, 1/4, …) nearest, on a log scale, to the share of them
    ``simulation.curve_exact_max_blocks`` is (at least the smallest rate): a sample of 0.71-1.41
    times that many blocks (0.5-0.71 times it for a table under 1.41 times the limit, which is
    sampled at 1/2, never whole). A power of two so that the rate stays put while a quarter's days
    are added, until the table has doubled: the sample gathered over the days before is then
    kept and carried on (:meth:`pipeline.sim.resume.DailyStream.gathered_curves`), not gathered
    again every day."""
    if settings.curve_sample_rate is not None:
        return settings.curve_sample_rate
    return power_of_two_rate(settings.curve_exact_max_blocks / max(blocks, 1), MAX_HALVINGS)


# The most a derived rate is halved: 2^-19 is the smallest power of two above MIN_SAMPLE_RATE.
MAX_HALVINGS = math.floor(-math.log2(MIN_SAMPLE_RATE))


class CurveGathering:
    """The sampled curves' reading of the table (:class:`CurveSampler` with each curve's router
    and the sessions they route by), fed the request parts in arrival order (:meth:`feed`, as
    often as more of the table comes), the curves at the end (:meth:`finish`). Between feeds
    it holds the sample and the routers' counters, so it can be kept (pickled) at the end of
    one day and fed the next days later (:mod:`pipeline.sim.resume`): the curves are those of
    one reading of all of them."""

    def __init__(
        self,
        settings: SimConfig,
        combinations: Sequence[Combination],
        rate: float,
        facts: TableFacts,
        latency_model: LatencyModel,
    ) -> None:
        _require_single_passes(combinations)
        if not streamable(combinations):  # least-loaded: streamed_curves flattens the table
            raise ValueError("a least-loaded curve is assigned on the whole table, not by part")
        self.sampler = CurveSampler(settings, combinations, rate)
        self.routers = {c: Router(c[2], c[1], settings) for c in combinations if c[1] > 1}
        needs_sessions = any(router.needs_sessions for router in self.routers.values())
        self.sessions = Sessions(facts.infer_sessions) if needs_sessions else None
        self.facts = facts
        self.latency_model = latency_model
        self.order = StreamOrder()

    @property
    def requests(self) -> int:
        """The requests read so far."""
        return self.sampler.seen.n

    def feed(self, chunks: RequestChunks) -> None:
        """Sample ``chunks`` (whole parts, the next of the table), each flattened as the
        streamed scenarios flatten it, each curve's replicas assigned by its router."""
        sampler, sessions = self.sampler, self.sessions
        stored = self.facts.block_size
        for part in flattened_after(chunks, self.latency_model, None, stored, self.order):
            start = sampler.seen.n
            home = sessions.hashes(part) if sessions is not None else None
            assigned = {c: r.assign(start, part, home) for c, r in self.routers.items()}
            sampler.add(part, assigned, whole=False)

    def finish(self) -> list[Curve]:
        """The curves of every part fed (the gathering is used up: its sample is drained)."""
        if self.sampler.seen.n == 0:
            raise SimulationInputError("request table is empty: nothing to replay")
        # the routers' and the session inference's state let go of before the depth passes
        self.routers, self.sessions = {}, None
        return self.sampler.curves()


def _require_single_passes(combinations: Sequence[Combination]) -> None:
    """Refuse a curve whose routing reads cache state (:func:`require_single_pass`)."""
    for _, replicas, routing in combinations:
        require_single_pass(routing, replicas)


def gathering_facts(
    chunks: RequestChunks, combinations: Sequence[Combination], parts: Sequence[Path] = ()
) -> TableFacts:
    """What :class:`CurveGathering` reads of the whole table before its first part
    (:meth:`TableFacts.of`)."""
    needs_sessions = any(r > 1 and routes_by_session(p) for _, r, p in combinations)
    return TableFacts.of(chunks, needs_sessions, parts)


def streamed_curves(
    parts: Sequence[Path],
    settings: SimConfig,
    latency: LatencyModel,
    combinations: Sequence[Combination],
    flattened: Callable[[], SimInputs],
    rate: float,
) -> list[Curve]:
    """The curves of the table in ``parts`` (arrival order) from a SHARDS sample of ``rate``,
    one part in memory at a time; when a curve's routing needs the whole table, ``flattened()``
    gives it and the same sample is taken from it."""
    if not streamable(combinations):
        _require_single_passes(combinations)
        sampler = CurveSampler(settings, combinations, rate)
        _sample_whole(sampler, flattened())
        return sampler.curves()
    chunks = part_chunks(parts)
    facts = gathering_facts(chunks, combinations, parts)
    gathering = CurveGathering(settings, combinations, rate, facts, latency)
    gathering.feed(chunks)
    return gathering.finish()


def _sample_whole(sampler: CurveSampler, whole: SimInputs) -> None:
    """Sample the flattened table, each curve's replicas assigned on the whole of it."""
    settings = sampler.settings
    assignments = {
        c: assign(whole, c[2], c[1], settings).replica for c in sampler.combinations if c[1] > 1
    }
    sampler.add(whole, assignments, whole=True)
