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
    same way are compared. Empty when every scenario agrees: to the token with an exact curve,
    within its stated ``hit_ratio_error`` (a share of the scenario's prompt tokens) with a
    sampled one.
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
    # each curve's sample rate and stated error (a sampled curve agrees within its error; an
    # exact curves table has neither column)
    sampling = [
        pl.col(c) if c in curves.columns else pl.lit(None, pl.Float64).alias(c)
        for c in ("sample_rate", "hit_ratio_error")
    ]
    has_curve = curve_rows.select("block_size", "replicas", "_r", *sampling).unique(
        ["block_size", "replicas", "_r"]
    )
    gap = (pl.col("curve_hit_tokens") - pl.col("hit_tokens_instant")).abs()
    within_sampling = (
        (pl.col("sample_rate") < 1) & (gap <= pl.col("hit_ratio_error") * pl.col("prompt_tokens"))
    ).fill_null(False)
    return (
        joined.join(has_curve, on=["block_size", "replicas", "_r"], how="inner")
        .filter(pl.col("curve_hit_tokens").ne_missing(pl.col("hit_tokens_instant")))
        .filter(~within_sampling)
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
