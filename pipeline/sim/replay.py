"""Scenarios: route the workload across replicas, replay it through their caches, summarise.

``assign(inp, routing, replicas, settings)`` gives the replica of every request for routings that
ignore cache state; ``simulate(inp, scenario, settings)`` replays one scenario through
``pipeline.sim.kernels`` (one event-driven kernel; the cache-aware router decides inside it) in
one of two request lifetimes (``durations``: blocks stay pinned until the request finishes;
``instant``: released at arrival, the model of the one-pass curve) and ``summarise`` turns
per-request hits into the scenario's statistics.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pipeline.shape.facts import LatencyModel
from pipeline.sim import kernels
from pipeline.sim.blocks import BlockView, ContentCoverage, SimInputs, SimulationInputError
from pipeline.sim.config import (
    CACHE_INDEPENDENT,
    MAX_REPLICAS,
    REQUEST_LIFETIMES,
    ROUTINGS,
    CacheAwareConfig,
    Scenario,
    SimConfig,
)

I64 = NDArray[np.int64]

# Routings decided inside the event loop, which then holds every replica's block state at once:
# replicas × (distinct blocks + queue entries) int32. Above this many bytes simulate refuses.
MAX_ROUTED_STATE_BYTES = kernels.MAX_STATE_BYTES  # 4 GiB, the kernel's own bound

# Routings whose decisions read request durations (logged e2e_ms, else the latency model).
USES_DURATIONS = frozenset({"least-loaded", "cache-aware"})
# A scenario warns when tokens pinned by running requests at their peak reach this share of a
# replica's cache: most of the cache is then busy and the hit figures depend on the durations.
PINNED_WARN_SHARE = 0.8

INSTANT_NOTE = "no durations: blocks released at arrival, nothing pinned"
ROUTER_VIEW_NOTE = (
    "the router scores replicas by their exact caches (as KV-event-driven routers do), not by "
    "sgl-router's approximate character tree"
)


@dataclass(frozen=True)
class Assignment:
    replica: I64
    spills: int = 0
    shed: int = 0  # requests least-loaded's loop shed (they leave no load behind)


@dataclass(frozen=True)
class ScenarioRun:
    """Per-request outcome of one scenario plus its router counters.

    ``hit_tokens_instant`` holds the instant-lifetime hits of the same scenario when the
    durations lifetime ran (what pinning by running requests costs); with the instant lifetime
    it is ``hit_tokens`` itself.
    """

    scenario: Scenario
    capacity_blocks: int
    hit_tokens: I64
    replica: I64
    spills: int
    balance_routed: int
    request_lifetime: str = "instant"
    replica_slots: int | None = None
    peak_pinned_blocks: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    # per request: shed by request_timeout_s (the durations lifetime's; their hit tokens are 0)
    shed: kernels.Flags = field(default_factory=lambda: np.zeros(0, np.bool_))
    request_timeout_s: float | None = None
    hit_tokens_instant: I64 | None = None
    cache_aware: CacheAwareConfig | None = None


def affinity_home(inp: SimInputs, replicas: int) -> I64:
    """Home replica of each request: stable hash of its session modulo R."""
    return (inp.session_hash % np.uint64(replicas)).astype(np.int64)


def assign(
    inp: SimInputs,
    routing: str,
    replicas: int,
    settings: SimConfig,
    *,
    lifetime: str = "instant",
) -> Assignment:
    """Replica per request for a routing that does not read cache state.

    ``random`` draws with ``settings.random_seed``; ``bounded-affinity`` spills past
    ``settings.bounded_affinity_margin``. ``least-loaded`` runs the replay's event loop without
    blocks (requests in flight per replica, durations stretched past ``replica_slots``, the
    requests ``lifetime``'s replay sheds taking no load), so its assignment is exactly what
    that replay would decide; the replay then serves each replica's stream on its own.
    """
    seed, margin = settings.random_seed, settings.bounded_affinity_margin
    replica_slots = settings.replica_slots
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
        no_blocks = np.zeros(n, np.int64)
        _, replica, _, _, shed = kernels.replay(
            np.zeros(n + 1, np.int64),
            np.zeros(0, np.int32),
            no_blocks,
            no_blocks,
            no_blocks,
            inp.prompt_tokens,
            1,
            1,
            inp.arrival_us,
            inp.duration_us,
            np.arange(n, dtype=np.int64),
            np.array([0, n], np.int64),
            kernels.LEAST_LOADED,
            replicas,
            0,
            1,
            True,
            replica_slots or 0,
            settings.timeout_us(lifetime),
            0.0,
            0,
            1.0,
        )
        return Assignment(replica, shed=int(shed.sum()))
    if routing == "least-served":
        return Assignment(kernels.least_served(inp.prompt_tokens + inp.output_tokens, replicas))
    home = affinity_home(inp, replicas)
    if routing == "affinity":
        return Assignment(home)
    replica, spills = kernels.bounded_affinity(home, replicas, margin)
    return Assignment(replica, int(spills))


def _queue_size(view: BlockView, capacity: int) -> int:
    # Live free-queue entries never exceed min(capacity, distinct blocks) + one request's
    # entries (its chain plus one run entry for its anonymous blocks); a queue four times that
    # keeps compaction amortised O(1) and rare, and one that holds every entry never compacts.
    distinct = view.n_ids + int(np.count_nonzero(view.missing))
    per_request = int((np.diff(view.offsets) + 1).max()) if view.offsets.size > 1 else 1
    entries = int(view.ids.size) + int(np.count_nonzero(view.missing))
    size = int(min(4 * (min(capacity, distinct) + per_request), entries) + 64)
    if size >= 2**31 - 1:
        raise SimulationInputError(f"cache queue of {size:,} entries exceeds the 2^31 limit")
    return size


def replica_streams(replica: NDArray[np.integer], replicas: int) -> tuple[I64, I64]:
    """Request indices grouped by replica (arrival order kept) and each group's start."""
    replica = np.ascontiguousarray(replica, dtype=np.int64)
    if replica.size and (int(replica.min()) < 0 or int(replica.max()) >= replicas):
        raise SimulationInputError(f"a replica index lies outside 0..{replicas - 1}")
    if replicas == 1:
        return np.arange(replica.size, dtype=np.int64), np.array([0, replica.size], np.int64)
    order, starts = kernels.group_by_replica(replica, replicas)
    return order, starts


def routed_state_bytes(view: BlockView, replicas: int, capacity: int) -> int:
    """Bytes of block state a router-in-the-loop replay holds: replicas × (blocks + queue) int32."""
    return replicas * (max(view.n_ids, 1) + _queue_size(view, capacity)) * 4


def check_scenario(scenario: Scenario, settings: SimConfig) -> None:
    """What a replay of ``scenario`` with ``settings`` requires of them."""
    request_lifetime, replica_slots = settings.request_lifetime, settings.replica_slots
    if request_lifetime not in REQUEST_LIFETIMES:
        raise SimulationInputError(
            f"unknown request lifetime {request_lifetime!r}; choose from {list(REQUEST_LIFETIMES)}"
        )
    if replica_slots is not None and replica_slots < 1:
        raise SimulationInputError(f"replica_slots must be positive or None, got {replica_slots}")
    if not 1 <= scenario.replicas <= MAX_REPLICAS or scenario.cache_tokens < 0:
        raise SimulationInputError(
            f"scenario {scenario.key}: replicas must lie in 1..{MAX_REPLICAS} and cache tokens "
            "be ≥ 0"
        )


def simulate(
    inp: SimInputs,
    scenario: Scenario,
    settings: SimConfig,
    *,
    assignment: Assignment | None = None,
    with_instant: bool = True,
) -> ScenarioRun:
    """Replay one scenario. ``assignment`` overrides the routing (must match ``replicas``).

    ``settings.request_lifetime``: ``durations`` pins a request's blocks from arrival until
    arrival + duration (logged ``e2e_ms``, else the latency model), stretched by ``max(1, n /
    replica_slots)`` for a request admitted with n requests in flight on its replica
    (``replica_slots`` None: never stretched), and a request stretched past
    ``request_timeout_s`` is shed (``shed``: no blocks, no hits); ``instant`` releases them at
    arrival and sheds nothing. With ``durations`` and ``with_instant`` the instant replay runs
    too (``hit_tokens_instant``), in a thread beside the durations replay when the machine has
    more than one core. The cache-aware router runs with ``settings.cache_aware``.
    """
    check_scenario(scenario, settings)
    request_lifetime, replica_slots = settings.request_lifetime, settings.replica_slots
    view = inp.blocks(scenario.block_size, scenario.tenant_isolation)
    capacity = scenario.cache_tokens // scenario.block_size
    replicas = scenario.replicas
    slots = replica_slots or 0
    ca: CacheAwareConfig | None = None
    if assignment is None and scenario.routing == "cache-aware" and replicas > 1:
        ca = settings.cache_aware
        need = routed_state_bytes(view, replicas, capacity)
        if need > MAX_ROUTED_STATE_BYTES:
            raise SimulationInputError(
                f"cache-aware routing keeps every replica's block state at once: {replicas} "
                f"replicas × ({max(view.n_ids, 1):,} blocks + {_queue_size(view, capacity):,} "
                f"queue entries) × 4 bytes = {need / 2**30:.1f} GiB, above the "
                f"{MAX_ROUTED_STATE_BYTES / 2**30:.0f} GiB limit (MAX_ROUTED_STATE_BYTES); use "
                "fewer replicas, a larger block size or a shorter trace"
            )
        routing = kernels.CACHE_AWARE
        order, starts = np.arange(inp.n, dtype=np.int64), np.array([0, inp.n], np.int64)
    else:
        if assignment is None:
            if replicas == 1:
                assignment = Assignment(np.zeros(inp.n, np.int64))
            else:
                assignment = assign(
                    inp, scenario.routing, replicas, settings, lifetime=request_lifetime
                )
        if assignment.replica.size != inp.n:
            raise SimulationInputError("assignment length differs from the number of requests")
        routing = kernels.FIXED
        order, starts = replica_streams(assignment.replica, replicas)
    knobs = settings.cache_aware
    streams = dict.fromkeys(REQUEST_LIFETIMES, (order, starts))
    if assignment is not None and assignment.shed:
        # least-loaded routes the instant replay by a load that includes what durations shed
        unshed = assign(inp, scenario.routing, replicas, settings)
        streams["instant"] = replica_streams(unshed.replica, replicas)

    def run(lifetime: str) -> tuple[I64, I64, int, I64, kernels.Flags]:
        hits, chosen, balance, peak, shed = kernels.replay(
            view.offsets,
            view.ids,
            view.prompt_blocks,
            view.missing,
            view.hit_limit,
            inp.prompt_tokens,
            scenario.block_size,
            max(view.n_ids, 1),
            inp.arrival_us,
            inp.duration_us,
            *streams[lifetime],
            routing,
            replicas,
            capacity,
            _queue_size(view, capacity),
            lifetime == "instant",
            slots,
            settings.timeout_us(lifetime),
            knobs.cache_threshold,
            knobs.balance_abs_threshold,
            knobs.balance_rel_threshold,
        )
        replica = assignment.replica if assignment is not None else chosen
        return hits, replica, balance, peak, shed

    instant_hits: I64 | None
    if request_lifetime == "durations" and with_instant and (os.cpu_count() or 1) > 1:
        # the two replays are independent and release the GIL: one per core
        with ThreadPoolExecutor(1) as pool:
            instant = pool.submit(run, "instant")
            hits, replica, balance, peak, shed = run(request_lifetime)
            instant_hits = instant.result()[0]
    else:
        hits, replica, balance, peak, shed = run(request_lifetime)
        instant_hits = hits
        if request_lifetime == "durations":
            instant_hits = run("instant")[0] if with_instant else None
    return ScenarioRun(
        scenario=scenario,
        capacity_blocks=capacity,
        hit_tokens=hits,
        replica=replica,
        spills=assignment.spills if assignment is not None else 0,
        balance_routed=int(balance),
        request_lifetime=request_lifetime,
        replica_slots=replica_slots,
        peak_pinned_blocks=peak,
        shed=shed,
        request_timeout_s=settings.request_timeout_s,
        hit_tokens_instant=instant_hits,
        cache_aware=ca,
    )


def per_replica_frame(inp: SimInputs, run: ScenarioRun) -> pl.DataFrame:
    """One row per replica: requests, tokens, hits (zero rows for replicas that got nothing).

    Hit figures cover the requests with prompt content (:class:`ContentCoverage`): a replica's
    hit ratio is over their prompt tokens (null when it got none), and every hit figure is
    null when the trace has no content at all.
    """
    return replica_rows(
        replica_sums(_per_request(inp, run)),
        run.scenario.replicas,
        known=inp.coverage().reason is None,
    )


def _per_request(inp: SimInputs, run: ScenarioRun) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "replica": run.replica,
            "prompt_tokens": inp.prompt_tokens,
            "content_prompt_tokens": np.where(inp.hashes_known, inp.prompt_tokens, 0),
            "output_tokens": inp.output_tokens,
            "hit_tokens": run.hit_tokens,
        }
    )


def replica_load(frame: pl.DataFrame, replicas: int, *, known: bool = True) -> pl.DataFrame:
    """Aggregate per-request ``replica, prompt_tokens, content_prompt_tokens, output_tokens,
    hit_tokens`` by replica; ``known`` false makes every hit figure null."""
    return replica_rows(replica_sums(frame), replicas, known=known)


# The per-replica sums a replica's row is made of (:func:`replica_sums`), in this order.
REPLICA_SUMS = ("requests", "prompt_tokens", "content_prompt_tokens", "output_tokens", "hit_tokens")


def replica_sums(frame: pl.DataFrame) -> pl.DataFrame:
    """``replica`` and the :data:`REPLICA_SUMS` of the replicas that got requests."""
    return frame.group_by("replica").agg(
        pl.len().cast(pl.Int64).alias("requests"),
        pl.col("prompt_tokens").sum(),
        pl.col("content_prompt_tokens").sum(),
        pl.col("output_tokens").sum(),
        pl.col("hit_tokens").sum(),
    )


def replica_rows(sums: pl.DataFrame, replicas: int, *, known: bool = True) -> pl.DataFrame:
    """Every replica's row from its sums (:func:`replica_sums`; a replica absent gets zeros):
    prefill, tokens and hit ratio beside them; ``known`` false makes every hit figure null."""
    all_replicas = pl.DataFrame({"replica": np.arange(replicas, dtype=np.int64)})
    content = pl.col("content_prompt_tokens")
    hits = pl.col("hit_tokens")
    return (
        all_replicas.join(sums, on="replica", how="left")
        .fill_null(0)
        .with_columns(
            (content - hits).alias("prefill_tokens"),
            (pl.col("prompt_tokens") + pl.col("output_tokens")).alias("tokens"),
            pl.when(content > 0).then(hits / content).otherwise(None).alias("hit_ratio"),
        )
        .with_columns(
            [
                pl.lit(None, dtype).alias(name)
                for name, dtype in (
                    ("hit_tokens", pl.Int64),
                    ("prefill_tokens", pl.Int64),
                    ("hit_ratio", pl.Float64),
                )
            ]
            if not known
            else []
        )
        .sort("replica")
    )


def _imbalance(values: pl.Series) -> float | None:
    """max / mean over replicas (1 when nothing was served; None when the values are unknown)."""
    if values.null_count() == values.len():
        return None
    mean = float(values.mean() or 0.0)  # type: ignore[arg-type]
    return float(values.max()) / mean if mean > 0 else 1.0  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorkloadTotals:
    """What a scenario's summary reads of the workload itself: counts and sums, no arrays."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    coverage: ContentCoverage
    durations_estimated: int
    latency_model: LatencyModel

    @classmethod
    def of(cls, inp: SimInputs) -> WorkloadTotals:
        return cls(
            inp.n,
            int(inp.prompt_tokens.sum()),
            int(inp.output_tokens.sum()),
            inp.coverage(),
            inp.durations_estimated,
            inp.latency_model,
        )


@dataclass(frozen=True)
class RunTotals:
    """A scenario's replay reduced to what its summary reads: per-replica sums
    (:func:`replica_sums`), hit totals and the router's counters; nothing per request."""

    scenario: Scenario
    capacity_blocks: int
    replica_sums: pl.DataFrame
    hit_tokens: int
    hit_tokens_instant: int | None
    spills: int
    balance_routed: int
    request_lifetime: str
    replica_slots: int | None
    peak_pinned_blocks: I64
    cache_aware: CacheAwareConfig | None
    shed_requests: int = 0
    request_timeout_s: float | None = None  # what shed them

    @classmethod
    def of(cls, inp: SimInputs, run: ScenarioRun) -> RunTotals:
        instant = run.hit_tokens_instant
        return cls(
            run.scenario,
            run.capacity_blocks,
            replica_sums(_per_request(inp, run)),
            int(run.hit_tokens.sum()),
            int(instant.sum()) if instant is not None else None,
            run.spills,
            run.balance_routed,
            run.request_lifetime,
            run.replica_slots,
            run.peak_pinned_blocks,
            run.cache_aware,
            int(run.shed.sum()),
            run.request_timeout_s,
        )


def summarise(inp: SimInputs, run: ScenarioRun) -> dict[str, Any]:
    """The scenario's statistics as a JSON-ready dict (per-replica rows sorted by replica).

    ``warnings`` says when the timeout shed requests (``shed_requests``, present only then),
    when tokens pinned by running requests at their peak reach ``PINNED_WARN_SHARE`` of a
    replica's cache capacity, and what the hit figures cover when only some requests carry
    prompt content. Hit figures cover the requests with
    content (:class:`~pipeline.sim.blocks.ContentCoverage`); with none they are null and
    ``hit_unknown_reason`` says why.
    """
    return summarise_totals(
        WorkloadTotals.of(inp), RunTotals.of(inp, run), lambda: inp.sessions_inferred
    )


def summarise_totals(
    inp: WorkloadTotals, run: RunTotals, sessions_inferred: Callable[[], int]
) -> dict[str, Any]:
    """:func:`summarise` from the workload's and the replay's totals (``sessions_inferred``
    is asked only for the affinity routings)."""
    sc = run.scenario
    coverage = inp.coverage
    known = coverage.reason is None
    replicas = replica_rows(run.replica_sums, sc.replicas, known=known)
    peak = np.zeros(sc.replicas, np.int64)
    peak[: run.peak_pinned_blocks.size] = run.peak_pinned_blocks
    replicas = replicas.with_columns(
        pl.Series("peak_pinned_blocks", peak, pl.Int64),
        pl.Series("peak_pinned_tokens", peak * sc.block_size, pl.Int64),
    )
    prompt = inp.prompt_tokens
    hit = run.hit_tokens
    durations = run.request_lifetime == "durations"
    durations_used = durations or (sc.routing in USES_DURATIONS and sc.replicas > 1)
    estimated = {
        "estimated_requests": inp.durations_estimated,
        "estimated": inp.durations_estimated > 0,
        "latency_model": inp.latency_model.as_dict() if inp.durations_estimated else None,
    }
    lifetime: dict[str, Any]
    if durations:
        lifetime = {
            "mode": "durations",
            "durations_logged": inp.requests - inp.durations_estimated,
            "durations_estimated": inp.durations_estimated,
            "latency_model": estimated["latency_model"],
            "replica_slots": run.replica_slots,
        }
    else:
        lifetime = {"mode": "instant", "note": INSTANT_NOTE}
    warnings: list[str] = []
    shed = run.shed_requests
    if shed:
        warnings.append(
            f"{sc.replicas} replica(s) cannot carry this traffic: {shed:,} of {inp.requests:,} "
            "requests shed, each one its overloaded replica would have finished more than "
            f"{run.request_timeout_s:g} s after it arrived (simulation.request_timeout_s); "
            "their prompt tokens count as not cached"
        )
    peak_tokens = int(peak.max(initial=0)) * sc.block_size
    if sc.cache_tokens > 0 and durations and peak_tokens >= PINNED_WARN_SHARE * sc.cache_tokens:
        warnings.append(
            f"tokens pinned by running requests at peak reach "
            f"{100 * peak_tokens / sc.cache_tokens:.0f} % of the cache capacity"
        )
    partial = coverage.partial_warning(inp.requests)
    if partial is not None:
        warnings.append(partial)
    instant_hit = run.hit_tokens_instant
    if not known:
        instant_hit = None
    out: dict[str, Any] = {
        "scenario": sc.key,
        "block_size": sc.block_size,
        "replicas": sc.replicas,
        "cache_tokens": sc.cache_tokens,
        "capacity_blocks": run.capacity_blocks,
        "routing": sc.routing,
        "tenant_isolation": sc.tenant_isolation,
        "requests": inp.requests,
        # said only when some were: a replay that kept up writes what it always wrote
        **({"shed_requests": shed} if shed else {}),
        "prompt_tokens": prompt,
        "output_tokens": inp.output_tokens,
        **coverage.as_dict(),
        "hit_tokens": hit if known else None,
        "hit_ratio": coverage.hit_ratio(hit),
        "prefill_tokens": coverage.prompt_tokens - hit if known else None,
        "hit_tokens_instant": instant_hit,
        "hit_ratio_instant": coverage.hit_ratio(instant_hit) if instant_hit is not None else None,
        "request_lifetime": lifetime,
        "peak_pinned_tokens": peak_tokens,
        "warnings": warnings,
        "spills": run.spills,
        "balance_routed": run.balance_routed,
        "cache_aware": (
            {**run.cache_aware.as_dict(), "router_view": ROUTER_VIEW_NOTE}
            if run.cache_aware is not None
            else None
        ),
        "request_imbalance": _imbalance(replicas["requests"]),
        "token_imbalance": _imbalance(replicas["tokens"]),
        "prefill_imbalance": _imbalance(replicas["prefill_tokens"]),
        "per_replica": replicas.to_dicts(),
        "sessions_inferred": sessions_inferred() if sc.routing.endswith("affinity") else 0,
        "durations": estimated if durations_used else None,
    }
    return out
