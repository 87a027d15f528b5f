"""Scenarios: route the workload across replicas, replay it through their caches, summarise.

``assign(inp, routing, replicas)`` gives the replica of every request for routings that ignore
cache state; ``simulate(inp, scenario)`` replays one scenario (the cache-aware router decides
inside the replay) and ``summarise`` turns per-request hits into the scenario's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pipeline.sim import kernels
from pipeline.sim.blocks import BlockView, SimInput, SimulationInputError
from pipeline.sim.config import (
    CACHE_INDEPENDENT,
    ROUTINGS,
    CacheAwareConfig,
    Scenario,
)

I64 = NDArray[np.int64]

# Above this many (replica, block) stamps (int32), replicas are replayed one after another.
_INTERLEAVED_MAX_STAMPS = 1 << 27  # 512 MiB

# Routings whose decisions read request durations (logged e2e_ms, else the latency model).
USES_DURATIONS = frozenset({"least-loaded", "cache-aware"})


@dataclass(frozen=True)
class Assignment:
    replica: I64
    spills: int = 0


@dataclass(frozen=True)
class ScenarioRun:
    """Per-request outcome of one scenario plus its router counters."""

    scenario: Scenario
    capacity_blocks: int
    hit_tokens: I64
    replica: I64
    spills: int
    balance_routed: int


def affinity_home(inp: SimInput, replicas: int) -> I64:
    """Home replica of each request: stable hash of its session modulo R."""
    return (inp.session_hash % np.uint64(replicas)).astype(np.int64)


def assign(
    inp: SimInput,
    routing: str,
    replicas: int,
    *,
    seed: int = 0,
    margin: float = 0.2,
) -> Assignment:
    """Replica per request for a routing that does not read cache state."""
    if routing not in ROUTINGS:
        raise SimulationInputError(f"unknown routing {routing!r}; choose from {list(ROUTINGS)}")
    if routing not in CACHE_INDEPENDENT:
        raise SimulationInputError(
            f"routing {routing!r} depends on cache state; it is decided inside the replay"
        )
    if replicas <= 0:
        raise SimulationInputError(f"replicas must be positive, got {replicas}")
    n = inp.n
    if routing == "round-robin":
        return Assignment(np.arange(n, dtype=np.int64) % replicas)
    if routing == "random":
        rng = np.random.default_rng(seed)
        return Assignment(rng.integers(0, replicas, size=n, dtype=np.int64))
    if routing == "least-loaded":
        return Assignment(kernels.least_loaded(inp.arrival_us, inp.duration_us, replicas))
    if routing == "least-served":
        return Assignment(kernels.least_served(inp.prompt_tokens + inp.output_tokens, replicas))
    home = affinity_home(inp, replicas)
    if routing == "affinity":
        return Assignment(home)
    replica, spills = kernels.bounded_affinity(home, replicas, margin)
    return Assignment(replica, int(spills))


def _queue_size(view: BlockView, capacity: int, entries: int) -> int:
    # Queue entries per request: its chain plus one run entry for its unknown output blocks.
    # Live entries never exceed min(capacity, distinct blocks) + one request's entries; a queue
    # four times that keeps compaction amortised O(1) and rare, and a queue that holds every
    # entry never compacts.
    distinct = view.n_ids + int(np.count_nonzero(view.missing))
    per_request = int((np.diff(view.offsets) + 1).max()) if view.offsets.size > 1 else 1
    bounded = 4 * (min(capacity, distinct) + per_request) + 64
    size = int(min(bounded, entries + 64))
    if size >= 2**31 - 1:
        raise SimulationInputError(f"cache queue of {size:,} entries exceeds the 2^31 limit")
    return size


def replica_streams(replica: I64, replicas: int) -> tuple[I64, I64]:
    """Request indices grouped by replica (arrival order kept) and each group's start."""
    replica = np.ascontiguousarray(replica, dtype=np.int64)
    if replica.size and (int(replica.min()) < 0 or int(replica.max()) >= replicas):
        raise SimulationInputError(f"a replica index lies outside 0..{replicas - 1}")
    if replicas == 1:
        return np.arange(replica.size, dtype=np.int64), np.array([0, replica.size], np.int64)
    order, starts = kernels.group_by_replica(replica, replicas)
    return order, starts


def simulate(
    inp: SimInput,
    scenario: Scenario,
    *,
    seed: int = 0,
    margin: float = 0.2,
    cache_aware: CacheAwareConfig | None = None,
    assignment: Assignment | None = None,
) -> ScenarioRun:
    """Replay one scenario. ``assignment`` overrides the routing (must match ``replicas``)."""
    view = inp.blocks(scenario.block_size, scenario.tenant_isolation)
    capacity = scenario.cache_tokens // scenario.block_size
    replicas = scenario.replicas
    n_ids = max(view.n_ids, 1)
    if assignment is None and scenario.routing == "cache-aware" and replicas > 1:
        ca = cache_aware or CacheAwareConfig()
        entries = np.diff(view.offsets) + (view.missing > 0)
        queue = _queue_size(view, capacity, int(entries.sum()))
        hits, replica, balance = kernels.replay_cache_aware(
            view.offsets,
            view.ids,
            view.prompt_blocks,
            view.missing,
            inp.prompt_tokens,
            view.hit_limit,
            scenario.block_size,
            n_ids,
            replicas,
            capacity,
            queue,
            inp.arrival_us,
            inp.duration_us,
            ca.cache_threshold,
            ca.balance_abs_threshold,
            ca.balance_rel_threshold,
        )
        return ScenarioRun(scenario, capacity, hits, replica, 0, int(balance))
    if assignment is None:
        if replicas == 1:
            assignment = Assignment(np.zeros(inp.n, np.int64))
        else:
            assignment = assign(inp, scenario.routing, replicas, seed=seed, margin=margin)
    if assignment.replica.size != inp.n:
        raise SimulationInputError("assignment length differs from the number of requests")
    order, starts = replica_streams(assignment.replica, replicas)
    if view.chained and replicas > 1 and replicas * n_ids <= _INTERLEAVED_MAX_STAMPS:
        hits = kernels.replay_fixed_chained_interleaved(
            view.offsets,
            view.ids,
            view.prompt_blocks,
            view.missing,
            view.hit_limit,
            scenario.block_size,
            n_ids,
            capacity,
            np.ascontiguousarray(assignment.replica, dtype=np.int64),
            order,
            starts,
        )
        return ScenarioRun(scenario, capacity, hits, assignment.replica, assignment.spills, 0)
    if view.chained:
        hits = kernels.replay_fixed_chained(
            view.offsets,
            view.ids,
            view.prompt_blocks,
            view.missing,
            view.hit_limit,
            scenario.block_size,
            n_ids,
            capacity,
            order,
            starts,
        )
        return ScenarioRun(scenario, capacity, hits, assignment.replica, assignment.spills, 0)
    entries = np.diff(view.offsets) + (view.missing > 0)
    per_replica = np.bincount(assignment.replica, weights=entries, minlength=replicas)
    queue = _queue_size(view, capacity, int(per_replica.max()))
    hits = kernels.replay_fixed(
        view.offsets,
        view.ids,
        view.prompt_blocks,
        view.missing,
        view.hit_limit,
        scenario.block_size,
        n_ids,
        capacity,
        queue,
        order,
        starts,
        view.chained,
    )
    return ScenarioRun(scenario, capacity, hits, assignment.replica, assignment.spills, 0)


def per_replica_frame(inp: SimInput, run: ScenarioRun) -> pl.DataFrame:
    """One row per replica: requests, tokens, hits (zero rows for replicas that got nothing)."""
    frame = pl.DataFrame(
        {
            "replica": run.replica,
            "prompt_tokens": inp.prompt_tokens,
            "output_tokens": inp.output_tokens,
            "hit_tokens": run.hit_tokens,
        }
    )
    return replica_load(frame, run.scenario.replicas)


def replica_load(frame: pl.DataFrame, replicas: int) -> pl.DataFrame:
    """Aggregate per-request ``replica, prompt_tokens, output_tokens, hit_tokens`` by replica."""
    all_replicas = pl.DataFrame({"replica": np.arange(replicas, dtype=np.int64)})
    return (
        all_replicas.join(
            frame.group_by("replica").agg(
                pl.len().cast(pl.Int64).alias("requests"),
                pl.col("prompt_tokens").sum(),
                pl.col("output_tokens").sum(),
                pl.col("hit_tokens").sum(),
            ),
            on="replica",
            how="left",
        )
        .fill_null(0)
        .with_columns(
            (pl.col("prompt_tokens") - pl.col("hit_tokens")).alias("prefill_tokens"),
            (pl.col("prompt_tokens") + pl.col("output_tokens")).alias("tokens"),
            pl.when(pl.col("prompt_tokens") > 0)
            .then(pl.col("hit_tokens") / pl.col("prompt_tokens"))
            .otherwise(0.0)
            .alias("hit_ratio"),
        )
        .sort("replica")
    )


def _imbalance(values: pl.Series) -> float:
    mean = float(values.mean() or 0.0)  # type: ignore[arg-type]
    return float(values.max()) / mean if mean > 0 else 1.0  # type: ignore[arg-type]


def summarise(inp: SimInput, run: ScenarioRun) -> dict[str, Any]:
    """The scenario's statistics as a JSON-ready dict (per-replica rows sorted by replica)."""
    sc = run.scenario
    replicas = per_replica_frame(inp, run)
    prompt = int(inp.prompt_tokens.sum())
    hit = int(run.hit_tokens.sum())
    durations_used = sc.routing in USES_DURATIONS and sc.replicas > 1
    out: dict[str, Any] = {
        "scenario": sc.key,
        "block_size": sc.block_size,
        "replicas": sc.replicas,
        "cache_tokens": sc.cache_tokens,
        "capacity_blocks": run.capacity_blocks,
        "routing": sc.routing,
        "tenant_isolation": sc.tenant_isolation,
        "requests": inp.n,
        "prompt_tokens": prompt,
        "output_tokens": int(inp.output_tokens.sum()),
        "hit_tokens": hit,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "prefill_tokens": prompt - hit,
        "spills": run.spills,
        "balance_routed": run.balance_routed,
        "request_imbalance": _imbalance(replicas["requests"]),
        "token_imbalance": _imbalance(replicas["tokens"]),
        "prefill_imbalance": _imbalance(replicas["prefill_tokens"]),
        "per_replica": replicas.to_dicts(),
        "sessions_inferred": inp.sessions_inferred if sc.routing.endswith("affinity") else 0,
        "durations": None,
    }
    if durations_used:
        out["durations"] = {
            "estimated_requests": inp.durations_estimated,
            "estimated": inp.durations_estimated > 0,
            "latency_model": inp.latency_model.as_dict() if inp.durations_estimated else None,
        }
    return out
