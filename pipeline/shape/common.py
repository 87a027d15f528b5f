"""Helpers every shape module shares: frame handling, percentiles, JSON-safe numbers."""

from __future__ import annotations

import math
from typing import Any, Final

import polars as pl

from pipeline.errors import EnginefitError
from pipeline.shape.facts import Percentiles

# One percentile method everywhere: polars ``quantile(q, "nearest")``, i.e. the sorted value at
# index floor((n - 1) * q + 0.5) (ties at .5 round up). It always returns an observed value and
# reproduces the figures stated in the Azure and Mooncake SOURCE.md files.
PERCENTILE_METHOD: Final = "nearest"
PERCENTILE_METHOD_DOC = (
    'polars quantile(q, "nearest"): sorted value at index floor((n-1)*q + 0.5), nulls ignored'
)
SKETCHED_PERCENTILE_METHOD_DOC = (
    'the sorted value polars quantile(q, "nearest") picks (index floor((n-1)*q + 0.5), nulls '
    "ignored), sketched: within relative error percentiles_sketched.relative_error of it"
)
QUANTILES: tuple[tuple[str, float], ...] = (
    ("p50", 0.5),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
)

US_PER_S = 1_000_000


class ShapeError(EnginefitError):
    """The request table cannot be measured (empty, null arrivals, negative durations)."""


def as_lazy(frame: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    return frame.lazy() if isinstance(frame, pl.DataFrame) else frame


def collect(frame: pl.LazyFrame) -> pl.DataFrame:
    """Collect with the streaming engine (bounded memory where the query allows it)."""
    return frame.collect(engine="streaming")


def sketched(frame: pl.LazyFrame, exact_max_requests: int) -> bool:
    """Whether a table is too large to measure whole (more than ``exact_max_requests`` rows)."""
    rows: int = collect(frame.select(pl.len())).item()
    return rows > exact_max_requests


def row_chunks(frame: pl.LazyFrame, chunk_rows: int) -> list[pl.LazyFrame]:
    """The table as consecutive slices of ``chunk_rows`` rows, in table order."""
    if chunk_rows < 1:
        raise ValueError(f"row_chunks: chunk_rows must be >= 1, got {chunk_rows}")
    rows: int = collect(frame.select(pl.len())).item()
    return [frame.slice(start, chunk_rows) for start in range(0, rows, chunk_rows)]


def arrival_us() -> pl.Expr:
    """Arrival as Int64 microseconds since the Unix epoch."""
    return pl.col("arrival").dt.epoch("us")


def quantile_exprs(column: str, prefix: str = "") -> list[pl.Expr]:
    return [
        pl.col(column).quantile(q, PERCENTILE_METHOD).alias(f"{prefix}{name}")
        for name, q in QUANTILES
    ]


def percentiles_from_row(row: dict[str, Any], prefix: str = "") -> Percentiles | None:
    """A :class:`Percentiles` from a row holding ``<prefix>p50 .. <prefix>max``; None if empty."""
    if row.get(f"{prefix}max") is None:
        return None
    return Percentiles(
        p50=float(row[f"{prefix}p50"]),
        p90=float(row[f"{prefix}p90"]),
        p95=float(row[f"{prefix}p95"]),
        p99=float(row[f"{prefix}p99"]),
        max=float(row[f"{prefix}max"]),
    )


def distribution(frame: pl.LazyFrame, column: str) -> dict[str, Any]:
    """count, min, mean, p50, p90, p95, p99, max and p99/p50 of a numeric column (nulls ignored)."""
    row = collect(
        frame.select(
            pl.col(column).count().alias("count"),
            pl.col(column).min().cast(pl.Float64).alias("min"),
            pl.col(column).mean().alias("mean"),
            *quantile_exprs(column),
            pl.col(column).max().cast(pl.Float64).alias("max"),
        )
    ).row(0, named=True)
    pct = percentiles_from_row(row)
    return {
        "count": int(row["count"]),
        "min": finite(row["min"]),
        "mean": finite(row["mean"]),
        **{name: finite(row[name]) for name, _ in QUANTILES},
        "max": finite(row["max"]),
        "p99_over_p50": None if pct is None else finite(pct.tail_ratio),
    }


def distribution_of_counts(counts: pl.DataFrame) -> dict[str, Any]:
    """:func:`distribution` of an integer column from its value counts (columns ``value``,
    ``n``; as :func:`pipeline.shape.lengths.value_counts` gives them): the same figures,
    exactly, from tables that merge by adding counts."""
    table = counts.filter(pl.col("n") > 0).sort("value")
    n = int(table["n"].sum()) if table.height else 0
    if n == 0:
        empty: dict[str, Any] = {name: None for name, _ in QUANTILES}
        return {"count": 0, "min": None, "mean": None, **empty, "max": None, "p99_over_p50": None}
    ends = table["n"].cum_sum()
    values = table["value"]
    row: dict[str, Any] = {
        name: float(values[int(ends.search_sorted(math.floor((n - 1) * q + 0.5), side="right"))])
        for name, q in QUANTILES
    }
    row["max"] = float(values[-1])
    total = int(table.select((pl.col("value").cast(pl.Int64) * pl.col("n")).sum()).item())
    pct = percentiles_from_row(row)
    return {
        "count": n,
        "min": float(values[0]),
        "mean": finite(total / n),
        **{name: finite(row[name]) for name, _ in QUANTILES},
        "max": finite(row["max"]),
        "p99_over_p50": None if pct is None else finite(pct.tail_ratio),
    }


def finite(value: Any) -> Any:
    """JSON-safe number: NaN and ±inf become None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats with None (tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return finite(value)
