"""Prompt and output token distributions (percentiles: see ``common.PERCENTILE_METHOD_DOC``)."""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.shape.common import (
    as_lazy,
    collect,
    distribution,
)
from pipeline.thresholds import LONG_CONTEXT_TOKENS

# Prompt sizes at which "long context" starts to matter for KV memory and chunked prefill (the
# decision's long-context threshold among them).
LONG_CONTEXT_SIZES: tuple[int, ...] = (8_192, LONG_CONTEXT_TOKENS, 131_072)


def long_context_shares(frame: pl.LazyFrame) -> dict[str, Any]:
    """Share of requests whose prompt is at least each of ``LONG_CONTEXT_SIZES`` tokens."""
    return long_context_of(collect(value_counts(frame, "prompt_tokens")))


def long_context_of(prompt_counts: pl.DataFrame) -> dict[str, Any]:
    """:func:`long_context_shares` from the prompt lengths' ``value_counts``."""
    row = prompt_counts.select(
        pl.col("n").sum().alias("n"),
        *[pl.col("n").filter(pl.col("value") >= t).sum().alias(str(t)) for t in LONG_CONTEXT_SIZES],
    ).row(0, named=True)
    n = int(row["n"])
    return {
        f">={t}": {"requests": int(row[str(t)]), "share": row[str(t)] / n if n else None}
        for t in LONG_CONTEXT_SIZES
    }


def value_counts(frame: pl.LazyFrame, column: str) -> pl.LazyFrame:
    """The distinct non-null values of ``column`` (``value``) and how many rows hold each
    (``n``), in no particular order."""
    return (
        frame.select(pl.col(column).drop_nulls().alias("value"))
        .group_by("value")
        .agg(pl.len().alias("n"))
    )


def length_metrics(
    frame: pl.LazyFrame, distributions: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Everything under ``lengths`` in ``workload_shape.json`` (``distributions``: those of
    prompt and output tokens when computed otherwise than from the whole columns)."""
    if distributions is None:
        distributions = {c: distribution(frame, c) for c in ("prompt_tokens", "output_tokens")}
    prompt = distributions["prompt_tokens"]
    output = dict(distributions["output_tokens"])
    output["logged"] = output["count"] > 0
    return {
        "prompt_tokens": prompt,
        "output_tokens": output,
        "long_context": long_context_shares(frame),
    }


def cdf_points(
    frame: pl.LazyFrame | pl.DataFrame, column: str, max_points: int = 2000
) -> pl.DataFrame:
    """Empirical CDF of a column: ``value`` and ``share`` (fraction of non-null rows ≤ value).

    Exact at every returned point; thinned to about ``max_points`` points by keeping the last
    distinct value in each 1/max_points band of cumulative share (the maximum is always kept).
    """
    return cdf_of_counts(collect(value_counts(as_lazy(frame), column)), max_points)


def cdf_of_counts(counts: pl.DataFrame, max_points: int = 2000) -> pl.DataFrame:
    """:func:`cdf_points` from a column's ``value_counts``."""
    counts = counts.sort("value").select(
        "value", (pl.col("n").cum_sum() / pl.col("n").sum()).alias("share")
    )
    if counts.height <= max_points:
        return counts
    return (
        counts.with_columns((pl.col("share") * max_points).floor().alias("band"))
        .group_by("band", maintain_order=True)
        .agg(pl.col("value").last(), pl.col("share").last())
        .select("value", "share")
        .sort("value")
    )
