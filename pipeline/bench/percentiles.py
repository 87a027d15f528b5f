"""Latency statistics recomputed from per-request data — one method for every tool.

Method (the only one used): over the *successful* requests of a load point (``ok``),

* ``ttft``  — one sample per request: ``ttft_ms``;
* ``e2e``   — one sample per request: ``e2e_ms``;
* ``tpot``  — one sample per request with ``output_tokens > 1``: ``tpot_ms``
  (``(e2e − ttft)/(out − 1)``, see :func:`pipeline.bench.readers._common.with_tpot`);
* ``itl``   — one sample per *gap*: every element of every ``itl_ms`` list, pooled;

mean = arithmetic mean, max = maximum, and p50/p90/p95/p99 = the **linear** interpolation
between closest ranks (numpy ``np.percentile(x, q, method="linear")``, the numpy default, and
polars ``quantile(q, interpolation="linear")``): with the samples sorted ``x[0] ≤ … ≤ x[n-1]``,
``h = (n − 1)·q``, ``p = x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋])``. Null samples are ignored;
a family with no samples stays null. Token-length statistics (mean, p50, p99 of
``input_tokens``/``output_tokens``, and whether min == max) use the same method.
"""

from __future__ import annotations

import polars as pl

from pipeline.bench.schema import LATENCY_METRICS, PERCENTILES

METHOD = "numpy-linear"


def _family(expr: pl.Expr, metric: str) -> list[pl.Expr]:
    out = [
        expr.mean().alias(f"{metric}_mean_ms"),
        expr.max().alias(f"{metric}_max_ms"),
        expr.count().alias(f"{metric}_n"),
    ]
    out += [
        expr.quantile(q, interpolation="linear").alias(f"{metric}_{name}_ms")
        for name, q in PERCENTILES.items()
    ]
    return out


def _lengths(column: str, prefix: str) -> list[pl.Expr]:
    x = pl.col(column).filter(pl.col("ok")).cast(pl.Float64)
    return [
        x.mean().alias(f"{prefix}_mean"),
        x.quantile(0.50, interpolation="linear").alias(f"{prefix}_p50"),
        x.quantile(0.99, interpolation="linear").alias(f"{prefix}_p99"),
        pl.when(x.count() > 0).then(x.min() == x.max()).otherwise(None).alias(f"{prefix}_fixed"),
    ]


def recompute_stats(per_request: pl.DataFrame) -> pl.DataFrame:
    """One row per ``point_id``: ``<m>_{mean,p50,p90,p95,p99,max}_ms`` and ``<m>_n`` (sample
    count) for m in ttft/tpot/itl/e2e, plus ``input_tokens_*``/``output_tokens_*`` length stats.

    ``per_request`` needs ``point_id``, ``ok``, ``ttft_ms``, ``e2e_ms``, ``tpot_ms``, ``itl_ms``,
    ``input_tokens``, ``output_tokens`` (PER_REQUEST_SCHEMA)."""
    ok = pl.col("ok")
    scalar = {m: pl.col(f"{m}_ms").filter(ok) for m in ("ttft", "tpot", "e2e")}
    per_point = (
        per_request.lazy()
        .group_by("point_id")
        .agg(
            *[e for m, expr in scalar.items() for e in _family(expr, m)],
            *_lengths("input_tokens", "input_tokens"),
            *_lengths("output_tokens", "output_tokens"),
        )
    )
    gaps = (
        per_request.lazy()
        .filter(ok)
        .select("point_id", "itl_ms")
        .explode("itl_ms")
        .group_by("point_id")
        .agg(_family(pl.col("itl_ms"), "itl"))
    )
    columns = [
        f"{m}_{s}"
        for m in LATENCY_METRICS
        for s in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "n")
    ]
    return (
        per_point.join(gaps, on="point_id", how="left")
        .with_columns(pl.col("itl_n").fill_null(0))
        .select(
            "point_id",
            *columns,
            *[
                f"{p}_{s}"
                for p in ("input_tokens", "output_tokens")
                for s in ("mean", "p50", "p99", "fixed")
            ],
        )
        .sort("point_id")
        .collect()
    )
