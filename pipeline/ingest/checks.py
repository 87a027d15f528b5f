"""Pure predicates over an ingested workload: each returns the list of problems (empty = pass)."""

from __future__ import annotations

import polars as pl


def non_empty(requests: pl.LazyFrame) -> list[str]:
    rows = requests.select(pl.len()).collect().item()
    return [] if rows else ["the workload has no requests"]


def no_negative_tokens(requests: pl.LazyFrame) -> list[str]:
    counts = requests.select(
        (pl.col("prompt_tokens") < 0).sum().alias("prompt_tokens"),
        (pl.col("output_tokens") < 0).sum().alias("output_tokens"),
        (pl.col("cached_tokens") < 0).sum().alias("cached_tokens"),
    ).collect()
    return [
        f"{count} rows with negative {name}"
        for name, count in counts.row(0, named=True).items()
        if count
    ]


def arrivals_sorted(requests: pl.LazyFrame) -> list[str]:
    backwards = (
        requests.select((pl.col("arrival").diff() < pl.duration(microseconds=0)).sum())
        .collect()
        .item()
    )
    return [f"{backwards} arrivals earlier than the row before them"] if backwards else []


# The workload's quarantine check warns past this share of records: a few malformed lines are
# normal in a production log, more means a reader or the trace is wrong.
QUARANTINE_WARN_SHARE = 0.01


def quarantine_share_below(
    read: int, quarantined: int, threshold: float = QUARANTINE_WARN_SHARE
) -> list[str]:
    share = quarantined / read if read else 0.0
    if share > threshold:
        return [f"{quarantined} of {read} records quarantined ({share:.2%} > {threshold:.2%})"]
    return []
