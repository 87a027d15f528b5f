"""Tables, a consistency predicate and plots built from scenario summaries and curves."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import polars as pl

from pipeline.sim.config import CACHE_INDEPENDENT
from pipeline.sim.curve import Curve

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    return pl.DataFrame(rows).sort("scenario", "replica")


def curves_frame(curves: list[Curve]) -> pl.DataFrame:
    frames = [c.frame() for c in curves]
    if not frames:
        return Curve(1, 1, "single", False, 0, np.zeros(0, np.int64), np.zeros(0, np.int64)).frame()
    return pl.concat(frames).sort("block_size", "replicas", "routing", "capacity_blocks")


def curve_disagreements(curves: pl.DataFrame, scenarios: pl.DataFrame) -> pl.DataFrame:
    """Cache-independent scenarios whose instant-lifetime hits differ from the curve there.

    The curve models the instant lifetime (nothing pinned), so it is compared with each
    scenario's ``hit_tokens_instant``. The curve's step function is read at the scenario's
    capacity: the last row at or below it. Empty when every scenario agrees (the one-pass curve
    is exact).
    """
    key = ["block_size", "replicas", "routing"]
    curve_rows = curves.with_columns(
        pl.when(pl.col("replicas") == 1).then(pl.lit("*")).otherwise(pl.col("routing")).alias("_r")
    )
    wanted = (
        scenarios.filter(
            pl.col("routing").is_in(sorted(CACHE_INDEPENDENT)) | (pl.col("replicas") == 1),
            ~pl.col("tenant_isolation"),
        )
        .with_columns(
            pl.when(pl.col("replicas") == 1)
            .then(pl.lit("*"))
            .otherwise(pl.col("routing"))
            .alias("_r")
        )
        .sort("capacity_blocks")
    )
    joined = wanted.join_asof(
        curve_rows.select(
            "block_size",
            "replicas",
            "_r",
            "capacity_blocks",
            pl.col("hit_tokens").alias("curve_hit_tokens"),
        ).sort("capacity_blocks"),
        on="capacity_blocks",
        by=["block_size", "replicas", "_r"],
        strategy="backward",
        check_sortedness=False,
    ).with_columns(pl.col("curve_hit_tokens").fill_null(0))
    has_curve = curve_rows.select(["block_size", "replicas", "_r"]).unique()
    return (
        joined.join(has_curve, on=["block_size", "replicas", "_r"], how="semi")
        .filter(pl.col("curve_hit_tokens") != pl.col("hit_tokens_instant"))
        .select("scenario", *key, "capacity_blocks", "hit_tokens_instant", "curve_hit_tokens")
        .sort("scenario")
    )


_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def _svg(fig: Any) -> bytes:
    buf = io.BytesIO()
    with plt.rc_context({"svg.hashsalt": "enginefit"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def plot_hit_ratio_vs_capacity(curves: pl.DataFrame, scenarios: pl.DataFrame) -> bytes:
    """Hit ratio against cache tokens per replica: a line per curve, a marker per scenario."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (bs, reps, routing), part in curves.sort("capacity_blocks").group_by(
        ["block_size", "replicas", "routing"], maintain_order=True
    ):
        label = f"{routing}, R={reps}, B={bs}" if reps > 1 else f"one replica, B={bs}"
        ax.step(part["cache_tokens"], part["hit_ratio"], where="post", label=label, lw=1.2)
    groups = scenarios.sort("routing", "cache_tokens").group_by(["routing"], maintain_order=True)
    for i, ((routing,), part) in enumerate(groups):
        multi = part.filter(pl.col("replicas") > 1)
        if multi.height:
            ax.plot(
                multi["cache_tokens"],
                multi["hit_ratio"],
                _MARKERS[i % len(_MARKERS)],
                ms=7 - i % 3,
                mfc="none",
                label=f"{routing} scenarios (R>1)",
            )
    ax.set_xscale("log")
    ax.set_xlabel("prefix-cache capacity per replica (tokens)")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Hit ratio vs cache capacity, by routing")
    fig.tight_layout()
    return _svg(fig)


def plot_imbalance_vs_hit_ratio(scenarios: pl.DataFrame) -> bytes:
    """Token load imbalance (max/mean over replicas) against hit ratio, one colour per routing."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    multi = scenarios.filter(pl.col("replicas") > 1).sort("routing", "scenario")
    for i, ((routing,), part) in enumerate(multi.group_by(["routing"], maintain_order=True)):
        marker = _MARKERS[i % len(_MARKERS)]
        ax.plot(part["hit_ratio"], part["token_imbalance"], marker, ms=7, label=str(routing))
    ax.set_xlabel("hit ratio (prompt tokens served from cache)")
    ax.set_ylabel("token load imbalance (max / mean)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.grid(True, alpha=0.3)
    if multi.height:
        ax.legend(fontsize=8)
    ax.set_title("Cache affinity vs load balance")
    fig.tight_layout()
    return _svg(fig)


def write_svg(path: Path, data: bytes) -> None:
    from pipeline.store import write_bytes_atomic

    write_bytes_atomic(path, data)
