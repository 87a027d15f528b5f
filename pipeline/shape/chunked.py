"""The shape figures that need a whole column at once, computed chunk by chunk instead (tables
above ``config.EXACT_MAX_REQUESTS`` rows).

* **Timestamps** (quantisation, inter-arrival): the sorted distinct instants are read one chunk
  (consecutive rows of the arrival-sorted table) at a time; the last run of a chunk is carried
  into the next, so an instant split by a chunk boundary is counted once and every gap between
  consecutive instants is seen once. Two passes (the second needs the smallest gap and the mean
  gap). Counts, extremes and the quantum are exact; Σ (g − mean)² is summed per chunk (float
  rounding may differ from the whole-column sum in the last digits).
* **Distributions** (lengths, sessions): count, sum, min and max exact; percentiles from a
  :class:`~pipeline.shape.sketch.QuantileSketch` per chunk, merged (relative error
  ``sketch.RELATIVE_ERROR``).
* **Sessions**: the logged sessions are split by a hash of ``session_id`` into groups of about a
  chunk's rows (spilled to a temporary folder in one pass), so each session lies in one group;
  turns, gaps and history growth are computed per group exactly as for the whole table and
  merged.

Everything else the stage measures is a streaming aggregation of the whole table already
(bounded by its groups, not its rows) and is reused as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline.shape.arrivals import (
    GridFit,
    TimestampFigures,
    gap_stats,
    gap_sums,
    quantisation,
    unit_gap,
)
from pipeline.shape.common import QUANTILES, ShapeError, arrival_us, collect, finite
from pipeline.shape.facts import Percentiles
from pipeline.shape.mix import session_steps
from pipeline.shape.sketch import RELATIVE_ERROR, QuantileSketch
from pipeline.spill import hash_groups


@dataclass
class SketchedDistribution:
    """:func:`pipeline.shape.common.distribution`'s figures, accumulated chunk by chunk."""

    sketch: QuantileSketch = field(default_factory=QuantileSketch)
    total: int | float = 0

    def add(self, values: pl.Series) -> None:
        values = values.drop_nulls()
        if values.len():
            got = values.sum()
            # Integers are summed exactly (Python ints); floats in float64.
            self.total += got if isinstance(got, int) else float(got)
            self.sketch.add(values.to_numpy())

    def as_dict(self) -> dict[str, Any]:
        s = self.sketch
        if s.count == 0:
            empty: dict[str, Any] = {name: None for name, _ in QUANTILES}
            return {
                "count": 0,
                "min": None,
                "mean": None,
                **empty,
                "max": None,
                "p99_over_p50": None,
            }
        pct = {name: s.quantile(q) for name, q in QUANTILES}
        p50, p99 = float(pct["p50"] or 0.0), float(pct["p99"] or 0.0)
        tail = Percentiles(p50=p50, p90=math.nan, p95=math.nan, p99=p99, max=s.max)
        return {
            "count": s.count,
            "min": finite(float(s.min)),
            "mean": finite(self.total / s.count),
            **{name: finite(v) for name, v in pct.items()},
            "max": finite(float(s.max)),
            "p99_over_p50": finite(tail.tail_ratio),
        }


def length_distributions(chunks: Sequence[pl.LazyFrame]) -> dict[str, dict[str, Any]]:
    """``distribution`` of prompt and output tokens over every chunk."""
    columns = ("prompt_tokens", "output_tokens")
    dists = {c: SketchedDistribution() for c in columns}
    for chunk in chunks:
        frame = collect(chunk.select(*columns))
        for c in columns:
            dists[c].add(frame[c])
    return {c: d.as_dict() for c, d in dists.items()}


def _distinct_runs(chunks: Sequence[pl.LazyFrame]) -> Iterator[tuple[pl.DataFrame, bool]]:
    """The distinct instants ``t`` (µs) and their counts ``c``, one chunk at a time, each
    table starting with the run carried from the previous chunk; the flag marks the last."""
    carried: pl.DataFrame | None = None
    for chunk in chunks:
        runs = collect(
            chunk.select(arrival_us().alias("t")).select(pl.col("t").rle()).unnest("t")
        ).select(pl.col("value").alias("t"), pl.col("len").cast(pl.Int64).alias("c"))
        if runs.height == 0:
            continue
        if (runs.height > 1 and int(runs["t"].diff().min()) <= 0) or (  # type: ignore[arg-type]
            carried is not None and int(runs["t"][0]) < int(carried["t"][0])
        ):
            raise ShapeError(
                "request table: arrivals are not sorted, and the chunked shape figures need "
                "them in order (sort by arrival, as ingest writes the canonical table)"
            )
        if carried is not None:
            if int(runs["t"][0]) == int(carried["t"][0]):
                runs = runs.with_columns(
                    pl.when(pl.int_range(pl.len()) == 0)
                    .then(pl.col("c") + int(carried["c"][0]))
                    .otherwise(pl.col("c"))
                    .alias("c")
                )
            else:
                runs = pl.concat([carried, runs])
        if carried is not None and runs.height == 1:
            carried = runs
            continue
        carried = runs.tail(1)
        yield runs, False
    if carried is not None:
        yield carried, True


def timestamp_figures_chunked(chunks: Sequence[pl.LazyFrame]) -> TimestampFigures:
    """:func:`pipeline.shape.arrivals.timestamp_figures`, chunk by chunk (module docstring)."""
    n = k = tie_rows = 0
    first = last = q0 = None
    for runs, is_last in _distinct_runs(chunks):
        done = runs if is_last else runs.head(runs.height - 1)
        n += int(done["c"].sum())
        k += done.height
        tie_rows += int(done.filter(pl.col("c") > 1)["c"].sum())
        first = int(runs["t"][0]) if first is None else first
        last = int(runs["t"][-1])
        if runs.height > 1:
            g = int(runs["t"].diff().min())  # type: ignore[arg-type]
            q0 = g if q0 is None else min(q0, g)
    if first is None or last is None:
        raise ShapeError("request table is empty: nothing to measure")
    if q0 is None:
        quant = quantisation(n, k, tie_rows, None)
        return TimestampFigures(quant, lambda: inter_arrival_of(n, k, first, last, 0.0, None, None))
    mean = (last - first) / (n - 1)
    on_grid, grid, ss = True, 0, 0.0
    gmax, gmax_at = -1, 0
    units: list[pl.DataFrame] = []
    for runs, _ in _distinct_runs(chunks):
        if runs.height < 2:
            continue
        on_grid = on_grid and bool(runs.select(((pl.col("t") % q0) == 0).all()).item())
        gaps = runs.select(pl.col("t").shift().alias("at"), pl.col("t").diff().alias("g"))
        gaps = gaps.drop_nulls()
        row = gap_sums(gaps, q0, mean)
        grid += int(row["grid"])
        ss += float(row["ss"])
        if int(row["max"]) > gmax:
            gmax, gmax_at = int(row["max"]), int(row["at"])
        units.append(gaps.filter(unit_gap(q0)).group_by("g").agg(pl.len().alias("n")))
    fit = GridFit(q0, gmax, grid / (k - 1), median_of_counts(units), on_grid)
    quant = quantisation(n, k, tie_rows, fit)
    return TimestampFigures(quant, lambda: inter_arrival_of(n, k, first, last, ss, gmax, gmax_at))


def inter_arrival_of(
    n: int, k: int, first: int, last: int, ss: float, gmax: int | None, at: int | None
) -> dict[str, Any]:
    if n < 2:
        return {"gaps": 0, "mean_gap_s": None, "std_gap_s": None, "cv": None}
    return gap_stats(n, k, (last - first) / (n - 1), ss, gmax, at)


def median_of_counts(counts: list[pl.DataFrame]) -> float:
    """polars' median of the values ``g`` counted ``n`` times across ``counts``."""
    table = pl.concat(counts).group_by("g").agg(pl.col("n").sum()).sort("g")
    total = int(table["n"].sum())
    ends = table["n"].cum_sum()
    low = int(table["g"][int(ends.search_sorted((total - 1) // 2, side="right"))])
    high = int(table["g"][int(ends.search_sorted(total // 2, side="right"))])
    return float(low) if low == high else low + (high - low) * 0.5


def session_metrics_chunked(chunks: Sequence[pl.LazyFrame], chunk_rows: int) -> dict[str, Any]:
    """:func:`pipeline.shape.mix.session_metrics`, one hash group of sessions at a time.

    One pass over the chunks writes each chunk's logged rows, split by group, to a temporary
    folder (:func:`pipeline.spill.hash_groups`; chunk order kept, so table order breaks ties
    as in the whole table); then each group is read back and measured alone.
    """
    rows = 0
    for chunk in chunks:
        rows += int(collect(chunk.select(pl.col("session_id").count())).item())
    if rows == 0:
        return {"known": False, "reason": "no session_id logged"}
    groups = max(1, math.ceil(rows / chunk_rows))
    turns, gaps, growth = SketchedDistribution(), SketchedDistribution(), SketchedDistribution()
    sessions = multi = negative = 0
    logged = [
        chunk.filter(pl.col("session_id").is_not_null()).select(
            "session_id", "arrival", "turn", "prompt_tokens"
        )
        for chunk in chunks
    ]
    with hash_groups(logged, "session_id", groups, "enginefit-sessions-") as members_by_group:
        for members in members_by_group:
            counts = collect(members.group_by("session_id").agg(pl.len().alias("turns")))["turns"]
            if counts.len() == 0:
                continue
            sessions += counts.len()
            multi += int((counts > 1).sum())
            turns.add(counts)
            steps = collect(session_steps(members))
            gaps.add(steps["gap_s"])
            growth.add(steps["growth"])
            negative += int((steps["growth"] < 0).sum())
    return {
        "known": True,
        "rows_with_session": rows,
        "sessions": sessions,
        "turns_per_session": turns.as_dict(),
        "multi_turn_sessions": multi,
        "inter_turn_gap_s": gaps.as_dict(),
        "history_growth_tokens": {**growth.as_dict(), "negative_steps": negative},
    }


def sketch_note(requests: int, exact_max_requests: int, merged: str = "chunks") -> dict[str, Any]:
    """What ``workload_shape.json`` records under ``percentiles_sketched`` (``merged``: what
    the sketches were merged across, ``chunks`` or ``days``)."""
    return {
        "relative_error": RELATIVE_ERROR,
        "method": f"DDSketch log-spaced buckets merged across {merged} (Masson et al., PVLDB 2019)",
        "requests": requests,
        "exact_max_requests": exact_max_requests,
    }
