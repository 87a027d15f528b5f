"""What the simulation stage produces: one summary per scenario, and the capacity curves.

The summaries (JSON documents, keys in the README) become ``scenarios.parquet`` (one row per
scenario) and ``replicas.parquet`` (one row per scenario and replica); the curves become
``curves.parquet`` (every step) and ``curves.json`` (log-spaced points).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline.sim.curve import CURVE_SCHEMA, Curve


@dataclass(frozen=True)
class SimResult:
    summaries: list[dict[str, Any]]
    curves: list[Curve]
    curve_points: list[dict[str, Any]]  # the curves at log-spaced capacities (curves.json)


SCENARIO_COLUMNS = [
    "scenario",
    "block_size",
    "replicas",
    "cache_tokens",
    "capacity_blocks",
    "routing",
    "tenant_isolation",
    "requests",
    "prompt_tokens",
    "output_tokens",
    "hit_tokens",
    "hit_ratio",
    "prefill_tokens",
    "content_requests",
    "content_share",
    "hit_unknown_reason",
    "request_lifetime",
    "hit_tokens_instant",
    "hit_ratio_instant",
    "peak_pinned_tokens",
    "warnings",
    "spills",
    "balance_routed",
    "request_imbalance",
    "token_imbalance",
    "prefill_imbalance",
    "sessions_inferred",
    "durations_estimated",
]


def scenario_frame(summaries: list[dict[str, Any]]) -> pl.DataFrame:
    """One row per scenario (per-replica detail dropped), sorted by scenario key."""
    rows = [
        {
            **{k: s[k] for k in SCENARIO_COLUMNS if k in s},
            "request_lifetime": s["request_lifetime"]["mode"],
            "durations_estimated": bool(s.get("durations") and s["durations"]["estimated"]),
        }
        for s in summaries
    ]
    schema = pl.Schema(
        {  # type: ignore[arg-type]  # classes and one List instance, as pipeline.schema
            "scenario": pl.String,
            "block_size": pl.Int64,
            "replicas": pl.Int64,
            "cache_tokens": pl.Int64,
            "capacity_blocks": pl.Int64,
            "routing": pl.String,
            "tenant_isolation": pl.Boolean,
            "requests": pl.Int64,
            "prompt_tokens": pl.Int64,
            "output_tokens": pl.Int64,
            "hit_tokens": pl.Int64,
            "hit_ratio": pl.Float64,
            "prefill_tokens": pl.Int64,
            "content_requests": pl.Int64,
            "content_share": pl.Float64,
            "hit_unknown_reason": pl.String,
            "request_lifetime": pl.String,
            "hit_tokens_instant": pl.Int64,
            "hit_ratio_instant": pl.Float64,
            "peak_pinned_tokens": pl.Int64,
            "warnings": pl.List(pl.String),
            "spills": pl.Int64,
            "balance_routed": pl.Int64,
            "request_imbalance": pl.Float64,
            "token_imbalance": pl.Float64,
            "prefill_imbalance": pl.Float64,
            "sessions_inferred": pl.Int64,
            "durations_estimated": pl.Boolean,
        }
    )
    return pl.DataFrame(rows, schema=schema).select(SCENARIO_COLUMNS).sort("scenario")


def replica_frame(summaries: list[dict[str, Any]]) -> pl.DataFrame:
    """One row per scenario and replica."""
    rows = [{"scenario": s["scenario"], **r} for s in summaries for r in s["per_replica"]]
    if not rows:
        return pl.DataFrame(schema={"scenario": pl.String, "replica": pl.Int64})
    # hit figures may be null in every row (a trace without prompt content): keep their types
    typed = {"hit_tokens": pl.Int64, "prefill_tokens": pl.Int64, "hit_ratio": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=typed).sort("scenario", "replica")


def curves_frame(curves: list[Curve]) -> pl.DataFrame:
    frames = [c.frame() for c in curves]
    if not frames:
        return pl.DataFrame(schema=CURVE_SCHEMA)
    return pl.concat(frames).sort("block_size", "replicas", "routing", "capacity_blocks")
