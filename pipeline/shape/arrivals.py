"""Arrival pattern: counts, span, mean and peak rates, burstiness, timestamp quantisation.

Definitions (all times from the canonical ``arrival`` column, microsecond precision):

* **span** = last arrival − first arrival; **mean rate** = requests / span (undefined for span 0).
* **Count windows** of w seconds are tumbling windows aligned to the Unix epoch (so 60 s windows
  are clock minutes): bucket = floor(arrival_us / w_us). Only **complete** windows count: those
  lying wholly inside the observed span [first arrival, last arrival + quantum) (quantum 0 when
  the timestamps are not quantised, since a bucketed timestamp stands for its whole bucket).
  The first and last windows are usually partial: their counts are a fraction of a window's
  and would read as a lull (a trace cut 10 s into a minute made pure Poisson look bursty).
  Every complete window counts, empty ones as zeros; fewer than ``MIN_COMPLETE_WINDOWS`` of
  them and the window is not reported. **Peak rate** = max count / w.
  **Index of dispersion** = variance / mean of those counts (population variance, ddof = 0);
  1 for a Poisson process, larger means burstier (unknown when every complete window is empty).
* **Inter-arrival CV** = std / mean of the gaps between consecutive arrivals (sorted, ties give
  zero gaps; population std). 1 for Poisson.
* **Quantisation**: a trace is *quantised* when at least half of its requests share their
  timestamp with another request *and* at least 90 % of the gaps between consecutive distinct
  timestamps are within 1 % of a multiple of the smallest such gap q0 (a regular grid, not a
  batch submission). The quantum is the median of the gaps that are ≈ q0. On a quantised trace
  inter-arrival statistics are not supported (the gaps are 0 or ≈ a quantum: artefacts), and a
  w-second window is supported only when it holds a whole number k of quanta (|w − k·quantum|
  ≤ 1 % of the quantum), and, unless every timestamp sits exactly on the grid, k ≥
  ``pipeline.shape.config.MIN_QUANTA_PER_WINDOW``. Otherwise its windows hold a varying number of buckets (a 10 s
  window over 3 s buckets holds 3 or 4; a 3 s window over jittery 3 s buckets 0 to 2), and the
  counts alias.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import polars as pl

from pipeline.shape.common import US_PER_S, ShapeError, arrival_us, collect, finite

WINDOWS_S: tuple[int, ...] = (1, 10, 60)
QUANTISED_TIE_SHARE = 0.5
GRID_SHARE = 0.9
GRID_TOLERANCE = 0.01
DAY_S = 86_400
# One complete window has no variance to measure; two are the least a dispersion needs.
MIN_COMPLETE_WINDOWS = 2
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def window_label(window_s: float) -> str:
    return f"{window_s:g}s"


@dataclass(frozen=True)
class Quantisation:
    """What the timestamps can resolve. ``quantum_s`` is None when the trace is not quantised."""

    quantised: bool
    distinct_timestamps: int
    tie_share: float
    min_distinct_gap_s: float | None
    max_distinct_gap_s: float | None
    grid_share: float | None
    quantum_s: float | None
    on_exact_grid: bool

    def window_support(self, window_s: float, min_quanta: float) -> tuple[bool, str | None]:
        """Whether counts in ``window_s``-second windows are meaningful, and why not if not."""
        if not self.quantised or self.quantum_s is None:
            return True, None
        quanta = round(window_s / self.quantum_s)
        whole = quanta >= 1 and abs(window_s - quanta * self.quantum_s) <= (
            GRID_TOLERANCE * self.quantum_s
        )
        if not whole:
            return False, (
                f"timestamps are quantised to ~{self.quantum_s:g} s buckets; a {window_s:g} s "
                "window is not a whole number of buckets, so its counts alias"
            )
        # On an exact grid every window holds exactly `quanta` buckets; on a jittery one a
        # window of a few quanta still catches one bucket more or less now and then.
        if quanta < min_quanta and not self.on_exact_grid:
            return False, (
                f"timestamps are quantised to ~{self.quantum_s:g} s buckets; a {window_s:g} s "
                f"window holds {quanta} and needs >= {min_quanta:g} "
                f"({min_quanta * self.quantum_s:g} s)"
            )
        return True, None

    def gaps_support(self) -> tuple[bool, str | None]:
        if not self.quantised:
            return True, None
        return False, (
            f"timestamps are quantised to ~{self.quantum_s:g} s buckets "
            f"({self.tie_share:.0%} of requests share a timestamp); gaps below the quantum "
            "are artefacts"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ObservedSpan:
    """The half-open time ``[start_us, end_us)`` (µs since the epoch) the trace observed."""

    start_us: int
    end_us: int

    def complete_windows(self, window_s: float) -> tuple[int, int]:
        """First and last index of the epoch-aligned windows lying wholly inside the span
        (last < first when there is none)."""
        w_us = round(window_s * US_PER_S)
        return -(-self.start_us // w_us), self.end_us // w_us - 1


def observed_span(first: str, last: str, quantum_s: float | None) -> ObservedSpan:
    """The span from the first arrival to the end of the last (its bucket's end when the
    timestamps are quantised): ``first``/``last`` as ``arrival_basics`` gives them."""
    start_us = (datetime.fromisoformat(first) - _EPOCH) // _ONE_US
    last_us = (datetime.fromisoformat(last) - _EPOCH) // _ONE_US
    return ObservedSpan(start_us, last_us + round((quantum_s or 0.0) * US_PER_S))


def arrival_basics(frame: pl.LazyFrame) -> dict[str, Any]:
    """requests, first, last, span_s, mean_rate_rps. Raises on an empty table or null arrivals."""
    row = collect(
        frame.select(
            pl.len().alias("requests"),
            pl.col("arrival").null_count().alias("nulls"),
            pl.col("arrival").min().alias("first"),
            pl.col("arrival").max().alias("last"),
        )
    ).row(0, named=True)
    if row["requests"] == 0:
        raise ShapeError("request table is empty: nothing to measure")
    if row["nulls"]:
        raise ShapeError(f"request table: {row['nulls']} rows have a null 'arrival'")
    return basics_of(int(row["requests"]), row["first"], row["last"])


def basics_of(requests: int, first: datetime, last: datetime) -> dict[str, Any]:
    """:func:`arrival_basics` from the count and the first and last arrivals."""
    span_s = (last - first).total_seconds()
    return {
        "requests": requests,
        "first": first.isoformat(),
        "last": last.isoformat(),
        "span_s": span_s,
        "mean_rate_rps": requests / span_s if span_s > 0 else None,
    }


def at_us(us: int) -> datetime:
    """The UTC instant ``us`` microseconds after the epoch (exactly, as polars reads it)."""
    return _EPOCH + us * _ONE_US


class ArrivalCounts(Protocol):
    """Requests counted by time: per epoch-aligned bucket, and per hour of day or day of week.
    From the request table (:class:`RequestArrivals`) or from per-second counts."""

    def per_bucket(self, bucket_us: int, lo: int, hi: int) -> pl.LazyFrame:
        """Columns ``b`` (floor(arrival_us / bucket_us), in [lo, hi]) and ``c`` (requests),
        one row per non-empty bucket."""
        ...

    def per_calendar(self, unit: str, start_us: int, end_us: int) -> pl.DataFrame:
        """Columns ``unit`` (``hour`` 0-23 or ``weekday`` 1-7, UTC) and ``n`` (requests)
        over the arrivals in [start_us, end_us)."""
        ...


@dataclass(frozen=True)
class RequestArrivals:
    """:class:`ArrivalCounts` of a request table."""

    frame: pl.LazyFrame

    def per_bucket(self, bucket_us: int, lo: int, hi: int) -> pl.LazyFrame:
        return (
            self.frame.select((arrival_us() // bucket_us).alias("b"))
            .filter(pl.col("b").is_between(lo, hi))
            .group_by("b")
            .agg(pl.len().alias("c"))
        )

    def per_calendar(self, unit: str, start_us: int, end_us: int) -> pl.DataFrame:
        expr = pl.col("arrival").dt.hour() if unit == "hour" else pl.col("arrival").dt.weekday()
        return collect(
            self.frame.filter(arrival_us().is_between(start_us, end_us, closed="left"))
            .select(expr.cast(pl.Int32).alias(unit))
            .group_by(unit)
            .agg(pl.len().alias("n"))
        )


def distinct_arrivals(frame: pl.LazyFrame) -> pl.DataFrame:
    """Sorted distinct arrival instants ``t`` (µs since epoch) and how many requests ``c`` each.

    One sort of the arrival column; quantisation and inter-arrival statistics both read it.
    """
    return collect(
        frame.select(arrival_us().alias("t")).sort("t").select(pl.col("t").rle()).unnest("t")
    ).select(pl.col("value").alias("t"), pl.col("len").cast(pl.Int64).alias("c"))


def detect_quantisation(frame: pl.LazyFrame, distinct: pl.DataFrame | None = None) -> Quantisation:
    """Detect bucketed timestamps (see the module docstring for the rule)."""
    table = distinct_arrivals(frame) if distinct is None else distinct
    n, k = int(table["c"].sum()), table.height
    tie_rows = int(table.filter(pl.col("c") > 1)["c"].sum())
    if k < 2:
        return quantisation(n, k, tie_rows, None)
    gaps = table.select(pl.col("t").diff().alias("g")).drop_nulls()
    q0 = int(gaps["g"].min())  # type: ignore[arg-type]
    row = gaps.select(
        pl.col("g").max().alias("gmax"),
        grid_fit(q0).mean().alias("grid_share"),
        pl.col("g").filter(unit_gap(q0)).median().alias("quantum"),
    ).row(0, named=True)
    on_grid = bool(table.select(((pl.col("t") % q0) == 0).all()).item())
    return quantisation(
        n, k, tie_rows, GridFit(q0, row["gmax"], float(row["grid_share"]), row["quantum"], on_grid)
    )


def grid_fit(q0: int) -> pl.Expr:
    """Whether each gap ``g`` lies within tolerance of a multiple of ``q0``."""
    tol = max(1.0, GRID_TOLERANCE * q0)
    return (pl.col("g") - (pl.col("g") / q0).round() * q0).abs() <= tol


def gap_sums(gaps: pl.DataFrame, q0: int, mean: float) -> dict[str, Any]:
    """Over ``gaps`` (columns ``at``, the instant a gap starts, and ``g``): how many lie on
    ``q0``'s grid (``grid``), Σ (g − mean)² (``ss``), the largest (``max``) and the earliest
    instant one that large starts (``at``)."""
    return gaps.select(
        grid_fit(q0).sum().alias("grid"),
        ((pl.col("g").cast(pl.Float64) - mean) ** 2).sum().alias("ss"),
        pl.col("g").max().alias("max"),
        pl.col("at").filter(pl.col("g") == pl.col("g").max()).min().alias("at"),
    ).row(0, named=True)


def unit_gap(q0: int) -> pl.Expr:
    """Whether each gap ``g`` rounds to one ``q0`` (the gaps whose median is the quantum)."""
    return (pl.col("g") / q0).round() == 1


@dataclass(frozen=True)
class GridFit:
    """The gaps between distinct timestamps (µs): the smallest and largest, the share on the
    grid of the smallest, the median of the one-step gaps, and whether every timestamp sits on
    the grid."""

    q0: int
    gmax: int
    grid_share: float
    quantum_us: float
    on_grid: bool


def quantisation(n: int, k: int, tie_rows: int, fit: GridFit | None) -> Quantisation:
    """The rule of the module docstring, from ``n`` requests at ``k`` distinct instants of which
    ``tie_rows`` share theirs, and the gap figures (None when k < 2)."""
    tie_share = tie_rows / n if n else 0.0
    if fit is None:
        return Quantisation(False, k, tie_share, None, None, None, None, False)
    quantised = tie_share >= QUANTISED_TIE_SHARE and fit.grid_share >= GRID_SHARE
    return Quantisation(
        quantised=quantised,
        distinct_timestamps=k,
        tie_share=tie_share,
        min_distinct_gap_s=fit.q0 / US_PER_S,
        max_distinct_gap_s=fit.gmax / US_PER_S,
        grid_share=fit.grid_share,
        quantum_s=fit.quantum_us / US_PER_S if quantised else None,
        on_exact_grid=fit.on_grid and quantised,
    )


def window_counts_stats(
    counts_of: ArrivalCounts | pl.LazyFrame, window_s: float, span: ObservedSpan
) -> dict[str, Any] | str:
    """Peak count, peak rate, mean count and index of dispersion over the complete
    ``window_s`` windows of ``span``, or why there are too few of them.

    Empty complete windows count as zeros; only non-empty buckets are materialised (the zeros
    enter through the window count).
    """
    lo, hi = span.complete_windows(window_s)
    bins = hi - lo + 1
    if bins < MIN_COMPLETE_WINDOWS:
        return (
            f"the trace holds {max(bins, 0)} complete {window_s:g} s window(s) and needs "
            f">= {MIN_COMPLETE_WINDOWS} (a partial window's count is not a {window_s:g} s count)"
        )
    w_us = round(window_s * US_PER_S)
    counts = counted(counts_of).per_bucket(w_us, lo, hi)
    row = collect(
        counts.select(
            pl.col("c").sum().alias("n"),
            (pl.col("c").cast(pl.Float64) ** 2).sum().alias("sumsq"),
            pl.col("c").max().alias("peak"),
            pl.col("b").filter(pl.col("c") == pl.col("c").max()).min().alias("peak_b"),
        )
    ).row(0, named=True)
    n, peak = int(row["n"]), int(row["peak"] or 0)
    mean = n / bins
    var = max(0.0, row["sumsq"] / bins - mean * mean)
    # With no request in any complete window the earliest (empty) one is the "peak".
    peak_b = row["peak_b"] if peak else lo
    peak_at = datetime.fromtimestamp(peak_b * w_us / US_PER_S, tz=UTC)
    return {
        "window_s": window_s,
        "bins": bins,
        "mean_count": mean,
        "variance": var,
        "index_of_dispersion": var / mean if mean > 0 else None,
        "peak_count": peak,
        "peak_rate_rps": peak / window_s,
        "peak_window_start": peak_at.isoformat(),
    }


def inter_arrival_stats(
    frame: pl.LazyFrame, distinct: pl.DataFrame | None = None
) -> dict[str, Any]:
    """Mean, std, CV and largest gap between consecutive arrivals (seconds).

    Computed from the distinct-instant table: the n − 1 gaps are the k − 1 gaps between
    distinct instants plus n − k zero gaps (ties).
    """
    table = distinct_arrivals(frame) if distinct is None else distinct
    n, k = int(table["c"].sum()), table.height
    if n < 2:
        return {"gaps": 0, "mean_gap_s": None, "std_gap_s": None, "cv": None}
    mean = (int(table["t"][-1]) - int(table["t"][0])) / (n - 1)
    g = table.select(pl.col("t").shift().alias("at"), pl.col("t").diff().alias("g")).drop_nulls()
    row = g.select(
        ((pl.col("g").cast(pl.Float64) - mean) ** 2).sum().alias("ss"),
        pl.col("g").max().alias("max"),
        pl.col("at").filter(pl.col("g") == pl.col("g").max()).min().alias("at"),
    ).row(0, named=True)
    at = row["at"] if k > 1 else None
    return gap_stats(n, k, mean, row["ss"] or 0.0, row["max"], at)


def gap_stats(
    n: int, k: int, mean: float, ss_distinct: float, gmax: int | None, gmax_at: int | None
) -> dict[str, Any]:
    """The inter-arrival figures from ``n`` arrivals at ``k`` distinct instants, the mean gap,
    Σ (g − mean)² over the k − 1 distinct gaps, and the largest gap and its start (µs)."""
    ss = ss_distinct + (n - k) * mean * mean
    std = math.sqrt(ss / (n - 1))
    out: dict[str, Any] = {
        "gaps": n - 1,
        "mean_gap_s": mean / US_PER_S,
        "std_gap_s": std / US_PER_S,
        "cv": finite(std / mean) if mean > 0 else None,
        "zero_gap_share": (n - k) / (n - 1),
    }
    if k > 1 and gmax is not None and gmax_at is not None:
        out["max_gap_s"] = gmax / US_PER_S
        out["max_gap_starts"] = datetime.fromtimestamp(gmax_at / US_PER_S, tz=UTC).isoformat()
    return out


def time_profile(counts_of: ArrivalCounts | pl.LazyFrame, span: ObservedSpan) -> dict[str, Any]:
    """Hour-of-day and day-of-week shares of requests (UTC) over the complete days of ``span``
    (hour of day: at least one; day of week: the first whole number of weeks, at least one).

    A partial day would weigh its hours more than the others (a trace from 10:00 to 16:00 the
    next day counts 10:00–16:00 twice), so only complete UTC days count. For traces with
    relative timestamps the hours are offsets from the configured anchor, not wall clock.
    """
    out: dict[str, Any] = {}
    first_day, last_day = span.complete_windows(DAY_S)
    whole_days = max(last_day - first_day + 1, 0)
    day_us = DAY_S * US_PER_S
    source = counted(counts_of)
    for key, unit, days, keys in (
        ("hour_of_day", "hour", whole_days, range(24)),
        ("day_of_week", "weekday", whole_days // 7 * 7, range(1, 8)),
    ):
        if days == 0:
            need = "one complete UTC day" if unit == "hour" else "seven complete UTC days"
            out[key] = {
                "supported": False,
                "reason": f"the trace holds {whole_days} complete UTC day(s) and needs {need} "
                "(partial days would weigh their hours more)",
            }
            continue
        counts = source.per_calendar(unit, first_day * day_us, (first_day + days) * day_us)
        got = dict(zip(counts[unit].to_list(), counts["n"].to_list(), strict=True))
        total = sum(got.values())
        rows = [
            {unit: k, "requests": got.get(k, 0), "share": got.get(k, 0) / total if total else 0.0}
            for k in keys
        ]
        shares = [r["share"] for r in rows]
        out[key] = {
            "supported": True,
            "timezone": "UTC",
            "complete_days": days,
            "profile": rows,
            "peak_to_trough": finite(max(shares) / min(shares)) if min(shares) > 0 else None,
        }
    return out


def arrival_series(
    counts_of: ArrivalCounts | pl.LazyFrame, bucket_s: float, span: ObservedSpan
) -> pl.DataFrame:
    """Requests per complete ``bucket_s`` bucket of ``span`` (epoch-aligned), empty buckets
    included, for plotting (a partial edge bucket would draw a lull that did not happen)."""
    b_us = round(bucket_s * US_PER_S)
    lo, hi = span.complete_windows(bucket_s)
    counts = collect(counted(counts_of).per_bucket(b_us, lo, hi).rename({"c": "n"}))
    grid = pl.DataFrame({"b": pl.int_range(lo, max(lo, hi + 1), eager=True)})
    return (
        grid.join(counts, on="b", how="left")
        .with_columns(pl.col("n").fill_null(0).cast(pl.Int64))
        .select(
            (pl.col("b") * b_us).cast(pl.Datetime("us", "UTC")).alias("bucket_start"),
            pl.col("n").alias("requests"),
        )
        .sort("bucket_start")
    )


def plot_bucket_s(span_s: float, finest_s: float, max_points: int) -> float:
    """The smallest 'nice' bucket ≥ ``finest_s`` giving at most ``max_points`` buckets."""
    for candidate in (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, DAY_S):
        if candidate >= finest_s and span_s / candidate + 1 <= max_points:
            return float(candidate)
    return float(max(finest_s, span_s / (max_points - 1)))


@dataclass(frozen=True)
class TimestampFigures:
    """The figures read from the sorted distinct arrival instants: quantisation and the
    inter-arrival statistics (computed on demand: they are not needed on a quantised trace)."""

    quantisation: Quantisation
    inter_arrival: Callable[[], dict[str, Any]]


def timestamp_figures(frame: pl.LazyFrame) -> TimestampFigures:
    """:class:`TimestampFigures` from one sort of the whole arrival column."""
    distinct = distinct_arrivals(frame)
    return TimestampFigures(
        detect_quantisation(frame, distinct), lambda: inter_arrival_stats(frame, distinct)
    )


def arrival_metrics(
    frame: pl.LazyFrame, min_quanta: float, timestamps: TimestampFigures | None = None
) -> dict[str, Any]:
    """Everything under ``arrivals`` in ``workload_shape.json`` (``timestamps``: the figures
    of the distinct instants when computed otherwise than from the whole column)."""
    basics = arrival_basics(frame)
    figures = timestamp_figures(frame) if timestamps is None else timestamps
    return arrival_metrics_of(basics, figures, RequestArrivals(frame), min_quanta)


def arrival_metrics_of(
    basics: dict[str, Any], figures: TimestampFigures, counts: ArrivalCounts, min_quanta: float
) -> dict[str, Any]:
    """:func:`arrival_metrics` from its parts: the basics, the distinct instants' figures and
    the requests counted by time."""
    quant = figures.quantisation
    span = observed_span(basics["first"], basics["last"], quant.quantum_s)
    windows: dict[str, Any] = {}
    for w in WINDOWS_S:
        ok, reason = quant.window_support(w, min_quanta)
        stats = window_counts_stats(counts, w, span) if ok else reason
        windows[window_label(w)] = (
            {"supported": True, **stats}
            if isinstance(stats, dict)
            else {"supported": False, "reason": stats, "window_s": w}
        )
    ok, reason = quant.gaps_support()
    if basics["requests"] < 2:
        ok, reason = False, "fewer than 2 requests"
    inter = {"supported": True, **figures.inter_arrival()} if ok else {}
    if ok and inter.get("cv") is None:
        ok, reason = False, "all requests arrive at the same instant"
    if not ok:
        inter = {"supported": False, "reason": reason}
    return {
        **basics,
        "quantisation": quant.as_dict(),
        "windows": windows,
        "inter_arrival": inter,
        **time_profile(counts, span),
    }


def counted(source: ArrivalCounts | pl.LazyFrame) -> ArrivalCounts:
    """``source`` as :class:`ArrivalCounts` (a request table is counted as it is read)."""
    return RequestArrivals(source) if isinstance(source, pl.LazyFrame) else source
