"""Peak concurrency: the +1/−1 sweep over request intervals.

Each request occupies the half-open interval [arrival, arrival + duration). At a timestamp where
one request ends and another starts, **the end is processed before the start**, so back-to-back
requests do not overlap; a zero-duration request occupies nothing. Concurrency at time t is
therefore #(starts ≤ t) − #(ends ≤ t), computed with two sorted-search passes (no event loop):
the peak is attained at some start, so evaluating at every start gives the exact maximum.

Durations are the logged ``e2e_ms`` when present. Rows without it get the
:class:`~pipeline.shape.facts.LatencyModel` estimate; if any row is estimated, every figure derived
from the sweep is labelled ``estimated`` with the model's parameters. End times are rounded to
whole microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.shape.common import (
    US_PER_S,
    ShapeError,
    arrival_us,
    as_lazy,
    collect,
    row_chunks,
    sketched,
)
from pipeline.shape.config import CHUNK_ROWS, EXACT_MAX_REQUESTS
from pipeline.shape.facts import LatencyModel


@dataclass(frozen=True)
class ConcurrencyResult:
    """Peak and mean concurrency, how durations were obtained, and the downsampled series."""

    peak: int
    peak_at: datetime | None
    mean: float | None
    estimated: bool
    durations_logged: int
    durations_estimated: int
    latency_model: LatencyModel | None
    series: pl.DataFrame

    @property
    def label(self) -> str:
        if not self.estimated or self.latency_model is None:
            return "exact (logged e2e_ms)"
        lm = self.latency_model
        return (
            f"estimated: duration = {lm.ttft_base_ms:g} ms + {lm.ttft_per_prompt_token_ms:g} ms"
            f"/prompt token + {lm.tpot_ms:g} ms/output token after the first (source: "
            f"{lm.source}) for "
            f"{self.durations_estimated:,} of {self.durations_logged + self.durations_estimated:,}"
            " requests"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak": self.peak,
            "peak_at": self.peak_at.isoformat() if self.peak_at else None,
            "mean": self.mean,
            "estimated": self.estimated,
            "label": self.label,
            "durations_logged": self.durations_logged,
            "durations_estimated": self.durations_estimated,
            "latency_model": self.latency_model.as_dict() if self.latency_model else None,
            "tie_order": "end before start at equal timestamps (half-open intervals)",
        }


def intervals(frame: pl.LazyFrame, latency_model: LatencyModel) -> pl.LazyFrame:
    """start_us, end_us (Int64 µs since epoch) and ``estimated`` per request."""
    return frame.select(
        arrival_us().alias("start_us"),
        (
            arrival_us()
            + (pl.coalesce(pl.col("e2e_ms"), latency_model.duration_ms_expr()) * 1000.0)
            .round()
            .cast(pl.Int64)
        ).alias("end_us"),
        pl.col("e2e_ms").is_null().alias("estimated"),
    )


def _validate(frame: pl.LazyFrame, latency_model: LatencyModel) -> tuple[int, int]:
    """(logged, estimated) duration counts; raises on negative or non-finite durations."""
    bad = collect(
        frame.filter(
            (pl.col("e2e_ms") < 0) | pl.col("e2e_ms").is_nan() | pl.col("e2e_ms").is_infinite()
        )
        .select("request_id", "source_file", "source_line", "e2e_ms")
        .head(1)
    )
    if bad.height:
        r = bad.row(0, named=True)
        raise ShapeError(
            f"{r['source_file']}:{r['source_line']}: request {r['request_id']!r} has "
            f"e2e_ms={r['e2e_ms']} (durations must be finite and >= 0)"
        )
    neg = collect(
        frame.filter(pl.col("e2e_ms").is_null() & (latency_model.duration_ms_expr() < 0))
        .select("request_id", "source_file", "source_line")
        .head(1)
    )
    if neg.height:
        r = neg.row(0, named=True)
        raise ShapeError(
            f"{r['source_file']}:{r['source_line']}: request {r['request_id']!r} gets a negative "
            "estimated duration (negative token counts?)"
        )
    row = collect(frame.select(pl.col("e2e_ms").count().alias("logged"), pl.len().alias("n"))).row(
        0, named=True
    )
    return int(row["logged"]), int(row["n"]) - int(row["logged"])


def _sorted_bounds(frame: pl.LazyFrame, latency_model: LatencyModel) -> pl.DataFrame:
    """Two independently sorted columns ``s`` (starts) and ``e`` (ends), same length."""
    iv = intervals(frame, latency_model)
    return pl.concat(
        [
            collect(iv.select(pl.col("start_us").sort().alias("s"))),
            collect(iv.select(pl.col("end_us").sort().alias("e"))),
        ],
        how="horizontal",
    )


def _level_at(points: pl.Expr) -> pl.Expr:
    """Concurrency just after all events at each time in ``points`` (ends before starts)."""
    return pl.col("s").search_sorted(points, side="right").cast(pl.Int64) - pl.col(
        "e"
    ).search_sorted(points, side="right").cast(pl.Int64)


def peak_concurrency(
    frame: pl.LazyFrame | pl.DataFrame,
    latency_model: LatencyModel,
    max_points: int = 2000,
    *,
    exact_max_requests: int = EXACT_MAX_REQUESTS,
    chunk_rows: int = CHUNK_ROWS,
) -> ConcurrencyResult:
    """Exact sweep over logged (or estimated) durations, plus a per-bucket max/min envelope.

    Above ``exact_max_requests`` rows the same sweep runs chunk by chunk
    (:func:`peak_concurrency_chunked`): the same figures, in memory bounded by a chunk.
    """
    lf = as_lazy(frame)
    if sketched(lf, exact_max_requests):
        return peak_concurrency_chunked(row_chunks(lf, chunk_rows), latency_model, max_points)
    logged, estimated = _validate(lf, latency_model)
    bounds = _sorted_bounds(lf, latency_model)
    if bounds.height == 0:
        raise ShapeError("request table is empty: nothing to measure")
    at_starts = bounds.select(pl.col("s").alias("t"), _level_at(pl.col("s")).alias("level"))
    top = at_starts.select(
        pl.col("level").max().alias("peak"),
        pl.col("t").filter(pl.col("level") == pl.col("level").max()).min().alias("at"),
    ).row(0, named=True)
    t0, t1 = int(bounds["s"][0]), int(bounds["e"].max())  # type: ignore[arg-type]
    busy_us = float((bounds["e"].cast(pl.Float64) - bounds["s"].cast(pl.Float64)).sum())
    peak = int(top["peak"])
    series = _envelope(bounds, at_starts, t0, t1, max_points)
    return ConcurrencyResult(
        peak=peak,
        peak_at=datetime.fromtimestamp(top["at"] / US_PER_S, tz=UTC) if peak > 0 else None,
        mean=busy_us / (t1 - t0) if t1 > t0 else None,
        estimated=estimated > 0,
        durations_logged=logged,
        durations_estimated=estimated,
        latency_model=latency_model if estimated > 0 else None,
        series=series.with_columns(pl.lit(estimated > 0).alias("estimated")),
    )


def _envelope(
    bounds: pl.DataFrame, at_starts: pl.DataFrame, t0: int, t1: int, max_points: int
) -> pl.DataFrame:
    """Max and min concurrency per bucket (≤ ``max_points`` buckets over [t0, t1]).

    The max over a bucket is attained at its left edge or at a start inside it; the min at its
    left edge or just after an end inside it, so those three point sets give the exact envelope.
    """
    width = nice_width_us(t1 - t0 + 1, max_points)
    t0 = t0 // width * width
    n_buckets = (t1 - t0) // width + 1
    edges = pl.Series("t", [t0 + i * width for i in range(n_buckets)], dtype=pl.Int64)
    at_edges = bounds.select(pl.lit(edges).alias("t"), _level_at(pl.lit(edges)).alias("level"))
    at_ends = bounds.select(pl.col("e").alias("t"), _level_at(pl.col("e")).alias("level"))
    bucket = ((pl.col("t") - t0) // width).alias("bucket")
    highs = pl.concat([at_edges, at_starts]).group_by(bucket).agg(pl.col("level").max().alias("hi"))
    lows = pl.concat([at_edges, at_ends]).group_by(bucket).agg(pl.col("level").min().alias("lo"))
    return (
        highs.join(lows, on="bucket", how="full", coalesce=True)
        .sort("bucket")
        .select(
            (pl.col("bucket") * width + t0).cast(pl.Datetime("us", "UTC")).alias("bucket_start"),
            pl.lit(width / US_PER_S).alias("bucket_s"),
            pl.col("hi").alias("concurrency_max"),
            pl.col("lo").alias("concurrency_min"),
        )
    )


def nice_width_us(span_us: int, max_points: int) -> int:
    """The smallest 1/2/5 × 10^k µs bucket width giving at most ``max_points`` buckets."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            width = step * scale
            if span_us // width + 1 <= max_points:
                return width
        scale *= 10


@dataclass(frozen=True)
class _ChunkBounds:
    """What the chunked sweep needs to know before it sweeps: the first start of every chunk,
    the overall first start and last end, the total busy time and the duration counts."""

    firsts: list[int]
    t0: int
    t1: int
    busy_us: int
    logged: int
    estimated: int


def _chunk_arrays(
    chunk: pl.LazyFrame, latency_model: LatencyModel
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    iv = collect(intervals(chunk, latency_model).select("start_us", "end_us"))
    return iv["start_us"].to_numpy(), iv["end_us"].to_numpy()


def _bounds(chunks: Sequence[pl.LazyFrame], latency_model: LatencyModel) -> _ChunkBounds:
    firsts: list[int] = []
    t1, busy, logged, estimated, previous = None, 0, 0, 0, None
    for chunk in chunks:
        got = _validate(chunk, latency_model)
        logged, estimated = logged + got[0], estimated + got[1]
        s, e = _chunk_arrays(chunk, latency_model)
        if s.size == 0:
            continue
        if np.any(s[1:] < s[:-1]) or (previous is not None and s[0] < previous):
            raise ShapeError(
                "request table: arrivals are not sorted, and the chunked concurrency sweep "
                "needs them in order (sort by arrival, as ingest writes the canonical table)"
            )
        firsts.append(int(s[0]))
        previous = int(s[-1])
        t1 = int(e.max()) if t1 is None else max(t1, int(e.max()))
        busy += int((e - s).sum())
    if t1 is None:
        raise ShapeError("request table is empty: nothing to measure")
    return _ChunkBounds(firsts, firsts[0], t1, busy, logged, estimated)


def _levels(
    times: npt.NDArray[np.int64],
    started: int,
    starts: npt.NDArray[np.int64],
    ended: int,
    ends: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Concurrency just after all events at each of ``times``: ``started``/``ended`` events
    before the sorted ``starts``/``ends``, ends before starts at equal times."""
    return (started + np.searchsorted(starts, times, side="right")) - (
        ended + np.searchsorted(ends, times, side="right")
    )


def _fold(
    target: npt.NDArray[np.int64],
    buckets: npt.NDArray[np.int64],
    levels: npt.NDArray[np.int64],
    op: np.ufunc,
) -> None:
    """``target[b] = op(target[b], op over the levels in bucket b)`` for sorted ``buckets``."""
    if buckets.size == 0:
        return
    firsts = np.flatnonzero(np.concatenate([[True], buckets[1:] != buckets[:-1]]))
    at = buckets[firsts]
    target[at] = op(target[at], op.reduceat(levels, firsts))


@dataclass
class EnvelopeGrid:
    """Max and min concurrency per bucket of ``width`` µs from ``origin`` (a multiple of
    ``width``), ``buckets`` of them, filled part by part by :func:`sweep_part`."""

    origin: int
    width: int
    buckets: int
    hi: npt.NDArray[np.int64] = field(init=False)
    lo: npt.NDArray[np.int64] = field(init=False)
    next_edge: int = 0  # the first bucket whose left edge no part has evaluated yet

    def __post_init__(self) -> None:
        self.hi = np.full(self.buckets, np.iinfo(np.int64).min, dtype=np.int64)
        self.lo = np.full(self.buckets, np.iinfo(np.int64).max, dtype=np.int64)

    def edges_before(self, until: int | None) -> npt.NDArray[np.int64]:
        """The left edges not evaluated yet that lie before ``until`` (all when None)."""
        stop = self.buckets
        if until is not None:
            stop = min(stop, max(self.next_edge, -(-(until - self.origin) // self.width)))
        edges = self.origin + self.width * np.arange(self.next_edge, stop, dtype=np.int64)
        self.next_edge = stop
        return edges

    def fold(
        self, times: npt.NDArray[np.int64], levels: npt.NDArray[np.int64], op: np.ufunc
    ) -> None:
        _fold(
            self.hi if op is np.maximum else self.lo,
            (times - self.origin) // self.width,
            levels,
            op,
        )


@dataclass(frozen=True)
class PartPeak:
    """The highest level a part's starts reach and the first start reaching it (level
    ``np.iinfo(np.int64).min`` when the part has no start)."""

    level: int
    at: int


def sweep_part(
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    pending: npt.NDArray[np.int64],
    until: int | None,
    grid: EnvelopeGrid,
) -> tuple[PartPeak, npt.NDArray[np.int64]]:
    """One part of the sweep: the requests starting in it (``starts`` sorted, ``ends`` theirs)
    and the ends still ``pending`` from earlier parts (the requests in flight as it begins).

    Every time before ``until`` (all, when None) is evaluated here: no later request starts
    before it. The levels at the grid's edges and at the starts fold into its maxima, those at
    the edges and after the ends into its minima; the ends at or after ``until`` are returned,
    carried into the next part (starts tied with ``until`` are that part's)."""
    ends = np.sort(np.concatenate([pending, ends]), kind="stable")
    at_edges = grid.edges_before(until)
    at_starts = starts if until is None else starts[starts < until]
    done = ends.size if until is None else int(np.searchsorted(ends, until, side="left"))
    at_ends = ends[:done]
    in_flight = pending.size
    lv_edges, lv_starts, lv_ends = (
        _levels(times, in_flight, starts, 0, ends) for times in (at_edges, at_starts, at_ends)
    )
    peak = PartPeak(np.iinfo(np.int64).min, 0)
    if lv_starts.size:
        top = int(np.argmax(lv_starts))
        peak = PartPeak(int(lv_starts[top]), int(at_starts[top]))
    for times, levels in ((at_edges, lv_edges), (at_starts, lv_starts)):
        grid.fold(times, levels, np.maximum)
    for times, levels in ((at_edges, lv_edges), (at_ends, lv_ends)):
        grid.fold(times, levels, np.minimum)
    return peak, ends[done:]


def envelope_frame(grid: EnvelopeGrid, estimated: bool) -> pl.DataFrame:
    """``concurrency.parquet``'s rows from a filled grid."""
    edges = grid.origin + grid.width * np.arange(grid.buckets, dtype=np.int64)
    return pl.DataFrame(
        {
            "bucket_start": pl.Series(edges).cast(pl.Datetime("us", "UTC")),
            "bucket_s": pl.Series([grid.width / US_PER_S] * grid.buckets, dtype=pl.Float64),
            "concurrency_max": pl.Series(grid.hi, dtype=pl.Int64),
            "concurrency_min": pl.Series(grid.lo, dtype=pl.Int64),
            "estimated": pl.Series([estimated] * grid.buckets, dtype=pl.Boolean),
        }
    )


def peak_concurrency_chunked(
    chunks: Sequence[pl.LazyFrame], latency_model: LatencyModel, max_points: int = 2000
) -> ConcurrencyResult:
    """The sweep of :func:`peak_concurrency` over consecutive chunks of a table sorted by
    arrival, holding one chunk and the requests still in flight at its end.

    The level at t is #(starts ≤ t) − #(ends ≤ t). Chunk c evaluates the times t before the next
    chunk's first start a (:func:`sweep_part`): every start ≤ t lies in chunks ≤ c and every
    end ≤ t belongs to a request of those chunks (a later request starts at ≥ a > t). Peak,
    its time and the envelope equal the whole-table sweep's; the mean uses the exact integer
    sum of durations.
    """
    kept = list(chunks)
    b = _bounds(kept, latency_model)
    width = nice_width_us(b.t1 - b.t0 + 1, max_points)
    g0 = b.t0 // width * width
    grid = EnvelopeGrid(g0, width, (b.t1 - g0) // width + 1)
    peak = PartPeak(np.iinfo(np.int64).min, 0)
    pending = np.zeros(0, dtype=np.int64)
    firsts = iter(b.firsts[1:])
    for chunk in kept:
        s, e = _chunk_arrays(chunk, latency_model)
        if s.size == 0:
            continue
        got, pending = sweep_part(s, e, pending, next(firsts, None), grid)
        peak = got if got.level > peak.level else peak
    return concurrency_result(
        peak, b.busy_us, b.t0, b.t1, b.logged, b.estimated, latency_model, grid
    )


def concurrency_result(
    peak: PartPeak,
    busy_us: int,
    t0: int,
    t1: int,
    logged: int,
    estimated: int,
    latency_model: LatencyModel,
    grid: EnvelopeGrid,
) -> ConcurrencyResult:
    """The figures of a sweep done part by part (``busy_us``: Σ durations, exact)."""
    return ConcurrencyResult(
        peak=peak.level,
        peak_at=datetime.fromtimestamp(peak.at / US_PER_S, tz=UTC) if peak.level > 0 else None,
        mean=float(busy_us) / (t1 - t0) if t1 > t0 else None,
        estimated=estimated > 0,
        durations_logged=logged,
        durations_estimated=estimated,
        latency_model=latency_model if estimated > 0 else None,
        series=envelope_frame(grid, estimated > 0),
    )
