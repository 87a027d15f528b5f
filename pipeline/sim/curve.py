"""Hit tokens at every cache capacity from one pass (LRU stack distances).

For a routing that ignores cache state the assignment is fixed, so each replica sees a fixed
request stream; with chained keys and tail-first refresh a capacity-C LRU cache holds exactly
the C most recent distinct blocks and stays prefix-closed, so a prompt block hits iff its stack
depth is ≤ C (Mattson et al. 1970). ``capacity_curve`` returns the exact step function
``hit_tokens(C)`` for every C at once; replicas share one capacity, so their histograms add.

The curve is the ``instant`` request lifetime of :func:`pipeline.sim.replay.simulate` (blocks
released at arrival, nothing pinned): it equals that replay token for token at every capacity.
Pinning by running requests (the ``durations`` lifetime) makes the effective capacity vary
with load, which no single stack-distance pass models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pipeline.sim import curve_kernels
from pipeline.sim.blocks import ContentCoverage, SimInputs, SimulationInputError
from pipeline.sim.config import CACHE_INDEPENDENT, SimConfig
from pipeline.sim.replay import Assignment, assign, replica_streams

# Log-spaced points per curve in curves.json and the command's output (curves.parquet holds
# every step): enough to draw it, few enough to read.
CURVE_POINTS = 64

I64 = NDArray[np.int64]


@dataclass(frozen=True)
class Curve:
    """``hit_tokens[i]`` tokens hit at every capacity ≥ ``capacity_blocks[i]`` blocks per replica.

    Hit figures cover the requests with prompt content (``coverage``, as the scenarios'): the
    hit ratio is over their prompt tokens, and with no content every hit figure is unknown.
    """

    block_size: int
    replicas: int
    routing: str
    tenant_isolation: bool
    prompt_tokens: int
    capacity_blocks: I64
    hit_tokens: I64
    coverage: ContentCoverage
    sample_rate: float = 1.0
    # Largest hit-ratio gap between the sample's two independent halves (pipeline.sim.
    # curve_stream): the sampled curve's estimated error; 0 when exact, None when not estimated.
    hit_ratio_error: float | None = 0.0
    # why a sampled curve knows nothing although the trace has prompt content (its sample kept
    # no block): its hits are then unknown, not 0
    sample_reason: str | None = None

    @property
    def unknown_reason(self) -> str | None:
        return self.coverage.reason or self.sample_reason

    def hit_tokens_at(self, cache_tokens: int) -> int:
        capacity = cache_tokens // self.block_size
        i = int(np.searchsorted(self.capacity_blocks, capacity, side="right")) - 1
        return int(self.hit_tokens[i]) if i >= 0 else 0

    def hit_ratio_at(self, cache_tokens: int) -> float | None:
        return self.coverage.hit_ratio(self.hit_tokens_at(cache_tokens))

    @property
    def max_hit_tokens(self) -> int:
        return int(self.hit_tokens[-1]) if self.hit_tokens.size else 0

    @property
    def saturation_cache_tokens(self) -> int:
        """Smallest per-replica capacity (tokens) that reaches the unbounded-cache hit count."""
        return int(self.capacity_blocks[-1]) * self.block_size if self.capacity_blocks.size else 0

    def frame(self) -> pl.DataFrame:
        """The whole step function, one row per capacity where the hit count rises; a curve
        whose hits are unknown is one row at capacity 0 with null hits and the reason."""
        known = self.unknown_reason is None
        capacity = self.capacity_blocks if known else np.zeros(1, np.int64)
        rows = capacity.size
        return pl.DataFrame(
            {
                "block_size": np.full(rows, self.block_size, np.int64),
                "replicas": np.full(rows, self.replicas, np.int64),
                "routing": [self.routing] * rows,
                "capacity_blocks": capacity,
                "cache_tokens": capacity * self.block_size,
                "hit_tokens": self.hit_tokens if known else [None],
                "hit_ratio": self.hit_tokens / self.coverage.prompt_tokens if known else [None],
                "content_share": [self.coverage.share] * rows,
                "hit_unknown_reason": [self.unknown_reason] * rows,
                "sample_rate": np.full(rows, self.sample_rate, np.float64),
                "hit_ratio_error": [self.hit_ratio_error] * rows,
            },
            schema=CURVE_SCHEMA,
        )

    def points(self, n: int = 64) -> list[dict[str, Any]]:
        """About ``n`` log-spaced capacities from one block to saturation, plus saturation
        (none when the hits are unknown)."""
        if self.unknown_reason is not None:
            return []
        top = max(int(self.capacity_blocks[-1]) if self.capacity_blocks.size else 1, 1)
        grid = np.unique(np.rint(np.logspace(0, math.log10(top), n)).astype(np.int64))
        out = []
        for cap in grid.tolist():
            cache_tokens = cap * self.block_size
            out.append(
                {
                    "capacity_blocks": cap,
                    "cache_tokens": cache_tokens,
                    "hit_tokens": self.hit_tokens_at(cache_tokens),
                    "hit_ratio": self.hit_ratio_at(cache_tokens),
                }
            )
        return out

    def as_dict(self, n_points: int = CURVE_POINTS) -> dict[str, Any]:
        known = self.unknown_reason is None
        return {
            "block_size": self.block_size,
            "replicas": self.replicas,
            "routing": self.routing,
            "tenant_isolation": self.tenant_isolation,
            "prompt_tokens": self.prompt_tokens,
            **self.coverage.as_dict(),
            "hit_unknown_reason": self.unknown_reason,
            "max_hit_tokens": self.max_hit_tokens if known else None,
            "max_hit_ratio": self.coverage.hit_ratio(self.max_hit_tokens) if known else None,
            "saturation_cache_tokens": self.saturation_cache_tokens if known else None,
            "sample_rate": self.sample_rate,
            "exact": self.sample_rate >= 1.0,
            # said only of a sampled curve: an exact run's file is the one it always was
            **({} if self.sample_rate >= 1.0 else {"hit_ratio_error": self.hit_ratio_error}),
            "points": self.points(n_points),
        }


CURVE_SCHEMA = pl.Schema(
    {
        "block_size": pl.Int64,
        "replicas": pl.Int64,
        "routing": pl.String,
        "capacity_blocks": pl.Int64,
        "cache_tokens": pl.Int64,
        "hit_tokens": pl.Int64,
        "hit_ratio": pl.Float64,
        "content_share": pl.Float64,
        "hit_unknown_reason": pl.String,
        "sample_rate": pl.Float64,
        "hit_ratio_error": pl.Float64,
    }
)


def require_single_pass(routing: str, replicas: int) -> None:
    """Refuse a routing that reads cache state (with more than one replica): its assignment
    depends on the capacity, so no single pass gives every capacity."""
    if replicas > 1 and routing not in CACHE_INDEPENDENT:
        raise SimulationInputError(
            f"routing {routing!r} reads cache state, so no single-pass curve exists; "
            "simulate each capacity instead"
        )


def capacity_curve(
    inp: SimInputs,
    settings: SimConfig,
    *,
    block_size: int,
    replicas: int,
    routing: str,
    assignment: Assignment | None = None,
    sample_rate: float = 1.0,
    sample_salt: int = 0,
) -> Curve:
    """Hit tokens for every per-replica capacity in one pass (exact unless ``sample_rate`` < 1).

    The curve is the ``instant`` request lifetime (see the module docstring); the settings give
    the tenant isolation and the routing's knobs (``replica_slots`` only shapes the least-loaded
    assignment). ``sample_rate`` < 1 applies SHARDS sampling (Waldspurger et al., FAST 2015):
    only blocks whose salted hash falls under the rate are tracked, depths and weights scaled
    by 1/rate.
    """
    tenant_isolation = settings.tenant_isolation
    if assignment is None:
        require_single_pass(routing, replicas)
    if not 0 < sample_rate <= 1:
        raise SimulationInputError(f"sample rate must be in (0, 1], got {sample_rate}")
    view = inp.blocks(block_size, tenant_isolation)
    if not view.chained:
        raise SimulationInputError(
            "the block ids do not form hash chains (an id follows different parents or sits "
            "at different positions), so caches need not stay prefix-closed and no exact "
            "one-pass curve exists; simulate each capacity instead"
        )
    if assignment is None:
        assignment = (
            Assignment(np.zeros(inp.n, np.int64))
            if replicas == 1
            else assign(inp, routing, replicas, settings)
        )
    order, starts = replica_streams(assignment.replica, replicas)
    per_request = np.diff(view.offsets) + view.missing
    if replicas == 1:
        accesses = np.array([per_request.sum()])
        unknown = np.array([view.missing.sum()])
    else:
        accesses = np.bincount(assignment.replica, weights=per_request, minlength=replicas)
        unknown = np.bincount(assignment.replica, weights=view.missing, minlength=replicas)
    if accesses.size and accesses.max() >= 2**31 - 1:
        raise SimulationInputError("more than 2^31 block accesses on one replica")
    # a depth never exceeds the distinct blocks a replica has seen
    bound = np.minimum(accesses, view.n_ids + unknown)
    hist_size = max(2, int(bound.max()) + 2 if bound.size else 2)
    if sample_rate >= 1:
        capacity_blocks, hit_tokens = curve_kernels.hit_steps_chained(
            view.offsets,
            view.ids,
            view.missing,
            view.hit_limit,
            block_size,
            max(view.n_ids, 1),
            order,
            starts,
            hist_size,
        )
    else:
        total = curve_kernels.stack_depth_histogram(
            view.offsets,
            view.ids,
            view.missing,
            view.hit_limit,
            block_size,
            max(view.n_ids, 1),
            order,
            starts,
            sample_threshold(sample_rate),
            np.uint64(sample_salt),
            hist_size,
        )
        depths = np.flatnonzero(total[1:]) + 1
        capacity_blocks, hit_tokens = sampled_steps(
            depths, total[depths], float(total[0]), float(view.hit_limit.sum()) * block_size
        )
    return Curve(
        block_size=block_size,
        replicas=replicas,
        routing=routing if replicas > 1 else "single",
        tenant_isolation=tenant_isolation,
        prompt_tokens=int(inp.prompt_tokens.sum()),
        capacity_blocks=capacity_blocks,
        hit_tokens=hit_tokens,
        coverage=inp.coverage(),
        sample_rate=float(sample_rate),
        hit_ratio_error=0.0 if sample_rate >= 1 else None,
    )


def sample_threshold(rate: float) -> np.uint64:
    """The SHARDS filter's bound: a key is sampled when ``splitmix64(key ^ salt)`` ≤ it."""
    return np.uint64(int(rate * 2.0**64) - 1)


def sampled_steps(
    capacity: I64, weight: NDArray[np.float64], sampled_weight: float, prompt_weight: float
) -> tuple[I64, I64]:
    """The curve's steps from a sampled depth histogram: hit ``weight`` at each ``capacity``
    (increasing, ≥ 1), the sampled lookups' weight, and every prompt block's hit weight.

    Ratio estimator: the sampled hits are scaled by (every prompt block's hit weight) / (the
    sampled lookups' weight), so the number of sampled references does not bias the curve (the
    role of SHARDS' adjustment).
    """
    if sampled_weight > 0:
        weight = weight * (prompt_weight / sampled_weight)
    weights = np.rint(weight).astype(np.int64)
    nz = np.flatnonzero(weights)
    return capacity[nz].astype(np.int64), np.cumsum(weights[nz])
