"""Pure predicates over the simulation outputs; each returns its problems (empty = pass)."""

from __future__ import annotations

import polars as pl

from pipeline.present.tables import cell
from pipeline.sim.config import CACHE_INDEPENDENT


def curve_disagreements(
    curves: pl.DataFrame, scenarios: pl.DataFrame, isolated: bool = False
) -> pl.DataFrame:
    """Cache-independent scenarios whose instant-lifetime hits differ from the curve there.

    The curve models the instant lifetime (nothing pinned), so it is compared with each
    scenario's ``hit_tokens_instant``. The curve's step function is read at the scenario's
    capacity: the last row at or below it (none: 0 hits). Unknown hits (a trace without prompt
    content: a null curve row and null scenario hits) agree only with unknown. ``isolated`` is
    the curves' tenant isolation (``simulation.tenant_isolation``): only scenarios replayed the
    same way are compared. Empty when every scenario agrees (the one-pass curve is exact).
    """
    key = ["block_size", "replicas", "routing"]
    curve_rows = curves.with_columns(
        pl.when(pl.col("replicas") == 1).then(pl.lit("*")).otherwise(pl.col("routing")).alias("_r")
    )
    wanted = (
        scenarios.filter(
            pl.col("routing").is_in(sorted(CACHE_INDEPENDENT)) | (pl.col("replicas") == 1),
            pl.col("tenant_isolation") == isolated,
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
            pl.col("capacity_blocks").alias("_step"),
            pl.col("hit_tokens").alias("curve_hit_tokens"),
        ).sort("capacity_blocks"),
        on="capacity_blocks",
        by=["block_size", "replicas", "_r"],
        strategy="backward",
        check_sortedness=False,
    ).with_columns(
        pl.when(pl.col("_step").is_null())
        .then(0)
        .otherwise(pl.col("curve_hit_tokens"))
        .alias("curve_hit_tokens")
    )
    has_curve = curve_rows.select(["block_size", "replicas", "_r"]).unique()
    return (
        joined.join(has_curve, on=["block_size", "replicas", "_r"], how="semi")
        .filter(pl.col("curve_hit_tokens").ne_missing(pl.col("hit_tokens_instant")))
        .select("scenario", *key, "capacity_blocks", "hit_tokens_instant", "curve_hit_tokens")
        .sort("scenario")
    )


def curve_matches_replay(
    curves: pl.DataFrame, scenarios: pl.DataFrame, isolated: bool = False
) -> list[str]:
    """Every cache-independent scenario's instant hits equal the one-pass curve at its capacity."""
    return [
        f"{row['scenario']}: replay {cell(row['hit_tokens_instant'])} hit tokens, curve "
        f"{cell(row['curve_hit_tokens'])} at {row['capacity_blocks']:,} blocks"
        for row in curve_disagreements(curves, scenarios, isolated).iter_rows(named=True)
    ]
