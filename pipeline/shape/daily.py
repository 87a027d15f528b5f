"""The shape figures of a quarter from per-day parts (a workload ingested as daily partitions,
above ``config.EXACT_MAX_REQUESTS`` requests).

Each UTC day is summarised on its own into parts (:class:`DayCounts`, :class:`DayGaps`,
:class:`DaySweep`), a handful of small tables that merge by adding counts; the quarter's figures are computed from the merged tables. A part is
kept on disk (:class:`PartStore`) under a key naming what it was computed from (the digest of
the day's ingest set, and what it depends on beyond its day), so a day ingested later, or
ingested again, costs that day's work: the other days' parts are read back.

What a part holds, and how the quarter is put together:

* **Counts** (``DayCounts``, from the day alone): requests per epoch second (count windows,
  hour-of-day and day-of-week profiles, the arrival figure; every window and plot bucket is a
  whole number of seconds), the distinct prompt and output lengths with their counts (the length
  percentiles, long-context shares and CDFs, exactly), requests per tenant and model, the
  feature and provider-cache counts, the distinct LoRA adapters, and the distinct arrival
  instants' counts (requests, distinct instants, tied rows, first, last, smallest gap).
* **Gaps** (``DayGaps``, from the day and the quarter's smallest gap q0 between distinct
  instants): the gaps on q0's grid, the one-step gaps' counts, the largest gap and where it
  starts, whether every instant is on the grid, and Σ of the gaps with Σ (g − day mean)²; the
  gaps across midnight (last instant of a day to the first of the next) are added when merging,
  and Σ (g − quarter mean)² follows exactly from the days' sums (Chan, Golub and LeVeque,
  "Algorithms for computing the sample variance", The American Statistician 37(3), 1983).
  Kept per q0: the parts stay valid while no new day brings a smaller gap.
* **Sweep** (``DaySweep``, from the day and the requests still in flight at its start): the
  concurrency sweep over the times of the day (:func:`pipeline.shape.concurrency.sweep_part`),
  max and min per ``FINE_US`` bucket, the peak and its start, Σ durations, and the ends carried
  past midnight. A day's sweep is reused while the requests carried into it are the same; the
  buckets fold exactly into the quarter's (every plot width at least ``FINE_US`` is a multiple
  of it). The ends after the last day are swept when merging.
* **Sessions** (logged ``session_id``): per session of the day its turns and its first and last
  turn (arrival, prompt tokens), the day's inter-turn gaps (sketched, ``sketch.RELATIVE_ERROR``)
  and history growth (counted exactly), part of the counts; a session that continues on a
  later day adds the step from its last turn there to its first turn here when merging, so a
  conversation that spans midnight is carried across. The sessions' days are merged a hash
  group of sessions at a time (``SESSION_GROUP_ROWS``), read back lazily, so the merge holds
  a group, not the quarter's sessions.

The figures equal the whole-table ones (``tests/test_shape_daily.py``): exactly, but the
inter-turn gap percentiles (sketched) and float sums in another order (their last digits). A
part that cannot be read back is made again; a day's counts may be made ahead, side by side
(``workload_shape_day``, :func:`pipeline.shape.stage.count_day`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.mirror import push_committed
from pipeline.remote import Mirror
from pipeline.shape.arrivals import (
    GridFit,
    TimestampFigures,
    arrival_metrics_of,
    at_us,
    basics_of,
    distinct_arrivals,
    gap_sums,
    grid_fit,
    quantisation,
    unit_gap,
)
from pipeline.shape.chunked import SketchedDistribution, inter_arrival_of, median_of_counts
from pipeline.shape.common import (
    US_PER_S,
    ShapeError,
    arrival_us,
    collect,
    distribution_of_counts,
)
from pipeline.shape.concurrency import (
    ConcurrencyResult,
    EnvelopeGrid,
    PartPeak,
    _validate,
    concurrency_result,
    intervals,
    nice_width_us,
    sweep_part,
)
from pipeline.shape.config import MIN_QUANTA_PER_WINDOW
from pipeline.shape.facts import LatencyModel
from pipeline.shape.lengths import cdf_of_counts, long_context_of, value_counts
from pipeline.shape.mix import (
    MAX_MODELS_LISTED,
    TOP_CATEGORIES,
    category_of,
    feature_sums,
    features_of,
    provider_cache_of,
    provider_cache_sums,
    session_steps,
)
from pipeline.shape.sketch import RELATIVE_ERROR, QuantileSketch, sketch_of, sketch_table
from pipeline.spill import hash_groups
from pipeline.store import json_bytes, write_bytes_atomic, write_parquet_atomic

# A day's envelope resolution (µs): it divides every 1/2/5 × 10^k µs plot width at least as
# wide, so the days' buckets fold exactly into the quarter's (whose width is at least 50 s for
# two days or more at 2,000 points).
FINE_US = 10_000_000
DAY_US = 86_400 * US_PER_S
# Bumped whenever what a part holds changes, so parts written before are computed again.
PART_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True)
class DaySource:
    """One UTC day of the workload: its name, its requests (sorted by arrival) and the digest
    of the ingest set they come from (None: not known, so its parts are never kept).
    ``unchanged``: whether that set is still the one of ``digest``, asked after a part is made
    and before it is kept (None: not asked; the reader holds the set)."""

    day: str
    requests: pl.LazyFrame
    digest: str | None
    unchanged: Callable[[], bool] | None = None

    @property
    def start_us(self) -> int:
        """Its midnight (UTC), in µs since the epoch."""
        return (dt.date.fromisoformat(self.day) - dt.date(1970, 1, 1)).days * DAY_US


# -- the parts ---------------------------------------------------------------------------------


@dataclass
class DayCounts:
    """Everything of a day that depends on its requests alone (module docstring)."""

    requests: int
    first_us: int
    last_us: int
    distinct: int
    tie_rows: int
    min_gap: int | None
    features: dict[str, int]
    provider: dict[str, int]
    session_rows: int
    negative_steps: int
    gap_total: float
    seconds: pl.DataFrame  # s, n
    prompt_tokens: pl.DataFrame  # value, n
    output_tokens: pl.DataFrame  # value, n
    tenant: pl.DataFrame  # tenant, requests
    model: pl.DataFrame  # model, requests
    lora: pl.DataFrame  # value (distinct adapters)
    # session_id, turns, first_t, first_prompt, last_t, last_prompt: scanned when read back
    # (a quarter's are about as many rows as its sessions; merged a hash group at a time)
    sessions: pl.LazyFrame
    growth: pl.DataFrame  # value, n (history growth within the day)
    gap_sketch: pl.DataFrame  # the inter-turn gaps' sketch (sketch_table)


@dataclass
class DayGaps:
    """The gaps between a day's distinct instants, measured against the quarter's q0."""

    q0: int
    grid: int
    gaps: int
    sum_g: int
    m2: float
    gmax: int | None
    gmax_at: int | None
    on_grid: bool
    units: pl.DataFrame  # g, n


@dataclass
class DaySweep:
    """A day's part of the concurrency sweep (module docstring)."""

    carry_in: str
    from_us: int
    until_us: int
    logged: int
    estimated: int
    busy_us: int
    t1: int
    peak_level: int
    peak_at: int
    fine: pl.DataFrame  # hi, lo per FINE_US bucket from from_us
    carried: pl.DataFrame  # end_us of the requests still in flight at until_us


def _scalars(part: Any) -> dict[str, Any]:
    return {f.name: getattr(part, f.name) for f in fields(part) if not _is_table(part, f.name)}


def _is_table(part: Any, name: str) -> bool:
    return isinstance(getattr(part, name), pl.DataFrame | pl.LazyFrame)


# What the parts read of a day: it is read once per part and measured in memory.
_COUNTED = (
    "arrival",
    "prompt_tokens",
    "output_tokens",
    "session_id",
    "turn",
    "tenant",
    "model",
    "lora_adapter",
    "structured_output",
    "tools",
    "cached_tokens",
)
_SWEPT = (
    "arrival",
    "prompt_tokens",
    "output_tokens",
    "e2e_ms",
    "request_id",
    "source_file",
    "source_line",
)


def day_counts(day: pl.LazyFrame) -> DayCounts | None:
    """:class:`DayCounts` of one day's requests (None for a day without any)."""
    frame = collect(day.select(_COUNTED)).lazy()
    head = collect(
        frame.select(pl.len().alias("n"), pl.col("arrival").null_count().alias("nulls"))
    ).row(0, named=True)
    if head["n"] == 0:
        return None
    if head["nulls"]:
        raise ShapeError(f"request table: {head['nulls']} rows have a null 'arrival'")
    distinct = distinct_arrivals(frame)
    gaps = distinct["t"].diff().drop_nulls()
    logged = frame.filter(pl.col("session_id").is_not_null())
    sessions = collect(
        logged.select(
            "session_id", arrival_us().alias("t"), "turn", pl.col("prompt_tokens").alias("p")
        )
        .sort(["session_id", "t", "turn"], nulls_last=True, maintain_order=True)
        .group_by("session_id", maintain_order=True)
        .agg(
            pl.len().alias("turns"),
            pl.col("t").first().alias("first_t"),
            pl.col("p").first().alias("first_prompt"),
            pl.col("t").last().alias("last_t"),
            pl.col("p").last().alias("last_prompt"),
        )
    )
    steps = collect(session_steps(logged))
    gap = SketchedDistribution()
    gap.add(steps["gap_s"])
    growth = steps.select(pl.col("growth").drop_nulls().alias("value")).group_by("value").len("n")
    features = collect(frame.select(*feature_sums())).row(0, named=True)
    provider = collect(provider_cache_sums(frame)).row(0, named=True)
    return DayCounts(
        requests=int(head["n"]),
        first_us=int(distinct["t"][0]),
        last_us=int(distinct["t"][-1]),
        distinct=distinct.height,
        tie_rows=int(distinct.filter(pl.col("c") > 1)["c"].sum()),
        min_gap=int(gaps.min()) if gaps.len() else None,  # type: ignore[arg-type]
        features={k: int(v or 0) for k, v in features.items()},
        provider={k: int(v or 0) for k, v in provider.items()},
        session_rows=int(sessions["turns"].sum()) if sessions.height else 0,
        negative_steps=int((steps["growth"] < 0).sum()),
        gap_total=float(gap.total),
        seconds=collect(frame.select((arrival_us() // US_PER_S).alias("s")).group_by("s").len("n")),
        prompt_tokens=collect(value_counts(frame, "prompt_tokens")),
        output_tokens=collect(value_counts(frame, "output_tokens")),
        tenant=_category_counts(frame, "tenant"),
        model=_category_counts(frame, "model"),
        lora=collect(frame.select(pl.col("lora_adapter").drop_nulls().unique().alias("value"))),
        sessions=sessions.lazy(),
        growth=growth,
        gap_sketch=sketch_table(gap.sketch),
    )


def _category_counts(frame: pl.LazyFrame, column: str) -> pl.DataFrame:
    return collect(
        frame.select(pl.col(column)).drop_nulls().group_by(column).agg(pl.len().alias("requests"))
    )


def day_gaps(frame: pl.LazyFrame, q0: int) -> DayGaps:
    """:class:`DayGaps` of one day's distinct instants against the quarter's ``q0``."""
    distinct = distinct_arrivals(frame)
    gaps = distinct.select(pl.col("t").shift().alias("at"), pl.col("t").diff().alias("g"))
    gaps = gaps.drop_nulls()
    on_grid = bool(distinct.select(((pl.col("t") % q0) == 0).all()).item())
    if gaps.height == 0:
        empty = pl.DataFrame(schema={"g": pl.Int64, "n": pl.UInt32})
        return DayGaps(q0, 0, 0, 0, 0.0, None, None, on_grid, empty)
    sum_g = int(distinct["t"][-1]) - int(distinct["t"][0])
    row = gap_sums(gaps, q0, sum_g / gaps.height)
    units = gaps.filter(unit_gap(q0)).group_by("g").agg(pl.len().alias("n"))
    return DayGaps(
        q0=q0,
        grid=int(row["grid"]),
        gaps=gaps.height,
        sum_g=sum_g,
        m2=float(row["ss"]),
        gmax=int(row["max"]),
        gmax_at=int(row["at"]),
        on_grid=on_grid,
        units=units,
    )


def carry_key(from_us: int, carried: npt.NDArray[np.int64]) -> str:
    """What a day's sweep depends on beyond the day: where it starts and the ends carried in."""
    digest = hashlib.sha256(np.int64(from_us).tobytes())
    digest.update(np.ascontiguousarray(carried, dtype=np.int64).tobytes())
    return digest.hexdigest()


def day_sweep(
    frame: pl.LazyFrame,
    latency: LatencyModel,
    from_us: int,
    until_us: int,
    carried: npt.NDArray[np.int64],
) -> DaySweep:
    """The sweep over [from_us, until_us) of one day's requests, with ``carried`` (sorted) the
    ends of earlier requests still in flight at ``from_us`` (a multiple of ``FINE_US``)."""
    frame = collect(frame.select(_SWEPT)).lazy()
    logged, estimated = _validate(frame, latency)
    iv = collect(intervals(frame, latency).select("start_us", "end_us"))
    s, e = iv["start_us"].to_numpy(), iv["end_us"].to_numpy()
    if np.any(s[1:] < s[:-1]):
        raise ShapeError(
            "request table: arrivals are not sorted, and the per-day concurrency sweep needs "
            "them in order (sort by arrival, as ingest writes the canonical table)"
        )
    grid = EnvelopeGrid(from_us, FINE_US, (until_us - from_us) // FINE_US)
    peak, pending = sweep_part(s, e, carried, until_us, grid)
    return DaySweep(
        carry_in=carry_key(from_us, carried),
        from_us=from_us,
        until_us=until_us,
        logged=logged,
        estimated=estimated,
        busy_us=int((e - s).sum()),
        t1=int(e.max()) if e.size else from_us,
        peak_level=peak.level,
        peak_at=peak.at,
        fine=pl.DataFrame({"hi": grid.hi, "lo": grid.lo}),
        carried=pl.DataFrame({"end_us": pending}, schema={"end_us": pl.Int64}),
    )


# -- keeping parts on disk ---------------------------------------------------------------------


@dataclass
class PartStore:
    """Parts kept under ``root`` (``<workload>/shape/days/``): one folder per day, kind and key
    (``<day>/<kind>-<key>/``), its tables as Parquet and the rest in ``part.json``, written
    last. Writing a day's part of one kind removes that day's older parts of that kind (all
    written here); a part that cannot be read back (a file of it removed or damaged) is made
    again. ``computed`` and ``read`` count the parts computed and read back, by kind (a day
    without requests has no part: it counts in neither).

    ``remote``: the workload's folder on object storage, when ``root`` is in its mirror
    (:mod:`pipeline.mirror`). A part made here is uploaded (its tables, then ``part.json``,
    which commits it) and the day's older parts of its kind deleted there too; a part this
    machine lacks is fetched from there before it is made. So the days counted side by side
    on machines of their own are read back by the one that measures the quarter."""

    root: Path
    remote: Mirror | None = None
    computed: dict[str, int] = field(default_factory=dict)
    read: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str | None:
        """One line on the parts used (None when none was: the table was measured whole)."""
        if not self.computed and not self.read:
            return None
        made, kept = sum(self.computed.values()), sum(self.read.values())
        return f"per-day parts: {made} computed, {kept} read back (kept in {self.root})"

    def get(
        self, kind: type[T], source: DaySource, key: str, make: Callable[[], T | None]
    ) -> T | None:
        """The part of ``kind`` for ``source`` and ``key``: read back, or made and kept (a
        day without requests has none: None, made again each time, as cheap as reading)."""
        name = kind.__name__
        if source.digest is None:
            made = make()
            if made is not None:
                self.computed[name] = self.computed.get(name, 0) + 1
            return made
        # What a part's bytes mean beyond the day: this module's version of them, polars' (the
        # Parquet it reads back) and the sketches' relative error (their bucket indices).
        made_by = f"{PART_VERSION}|{pl.__version__}|{RELATIVE_ERROR!r}"
        full = hashlib.sha256(f"{made_by}|{source.digest}|{key}".encode()).hexdigest()[:24]
        folder = self.root / source.day / f"{name}-{full}"
        marker = folder / _PART_MARKER
        if self.remote is not None and not marker.is_file():
            fetch_part(self.remote, kind, folder)
        if marker.is_file():
            try:
                part = _read_part(kind, folder)
            except (OSError, ValueError, TypeError, pl.exceptions.PolarsError):
                shutil.rmtree(folder, ignore_errors=True)  # damaged: made again below
            else:
                self.read[name] = self.read.get(name, 0) + 1
                _drop_older(folder)
                return part
        made = make()
        if made is None:
            return None
        if source.unchanged is not None and not source.unchanged():
            raise ShapeError(
                f"{source.day}: the day's requests were ingested again while they were counted; "
                "run this step again"
            )
        self.computed[name] = self.computed.get(name, 0) + 1
        tables, scalars = _write_tables(made, folder)
        if self.remote is not None:  # uploaded before it is kept: a failed upload is retried
            upload_part(self.remote, folder, tables, scalars)
        write_bytes_atomic(marker, scalars)
        _drop_older(folder)
        return _read_part(kind, folder)  # as kept: its large tables scanned, not held


def counted_day(source: DaySource, store: PartStore) -> DayCounts | None:
    """The day's :class:`DayCounts`, read back or computed and kept (None: no request)."""
    return store.get(DayCounts, source, "", partial(day_counts, source.requests))


def _present(part: T | None) -> T:
    """A part only a day with requests has (they have been counted, so it has some)."""
    if part is None:
        raise ShapeError("a day's requests changed while the shape stage read them")
    return part


def _write_tables(part: Any, folder: Path) -> tuple[list[Path], bytes]:
    """The part's tables written to ``folder``, and the bytes of its ``part.json`` (the rest),
    which the caller writes last: it commits the part."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for f in fields(part):
        if _is_table(part, f.name):
            table = getattr(part, f.name)
            table = table.collect() if isinstance(table, pl.LazyFrame) else table
            write_parquet_atomic(table, folder / f"{f.name}.parquet")
            written.append(folder / f"{f.name}.parquet")
    return written, json_bytes(_scalars(part))


def _drop_older(folder: Path) -> None:
    """The other parts of ``folder``'s day and kind (older ones: written here or fetched)."""
    kind = folder.name.split("-", 1)[0]
    for older in folder.parent.glob(f"{kind}-*"):
        if older != folder and older.is_dir() and _PART_FOLDER.match(older.name):
            shutil.rmtree(older, ignore_errors=True)


# A part's folder below its day's: its kind and key (only such folders are replaced remotely).
_PART_FOLDER = re.compile(r"^[A-Z][A-Za-z]+-[0-9a-f]{24}$")
_PART_MARKER = "part.json"


def upload_part(mirror: Mirror, folder: Path, tables: Sequence[Path], marker: bytes) -> None:
    """A part made in the mirror's ``folder`` uploaded: its ``tables``, then its ``part.json``
    (``marker``), which commits it; then the older parts of its day and kind that the bucket
    holds are deleted, each ``part.json`` first (a part folder is only ever this module's)."""
    push_committed(mirror, tables, folder / _PART_MARKER, marker)
    day = folder.parent.relative_to(mirror.local).as_posix()
    kind = folder.name.split("-", 1)[0]
    older = [
        key
        for key in mirror.remote.list(day)
        if (name := key[len(day) + 1 :].split("/", 1)[0]) != folder.name
        and name.startswith(f"{kind}-")
        and _PART_FOLDER.match(name)
    ]
    _delete_marker_first(mirror, older)


def _delete_marker_first(mirror: Mirror, keys: Sequence[str]) -> None:
    """Delete ``keys`` from the bucket, folder by folder, each folder's ``part.json`` first (a
    part without it is not one: a reader never takes a half-deleted part)."""
    for key in sorted(keys, key=lambda k: (k.rsplit("/", 1)[0], k.endswith(_PART_MARKER)))[::-1]:
        mirror.remote.delete(key)


def forget_parts(root: Path, mirror: Mirror | None) -> None:
    """Every part of the store at ``root`` removed (a store no longer used), in the bucket too,
    each ``part.json`` first; only part folders (``<day>/<Kind>-<key>/``) and the folders they
    leave empty go."""
    if mirror is not None:
        relative = root.relative_to(mirror.local).as_posix()
        keys = [
            key
            for key in mirror.remote.list(relative)
            if len(parts := key[len(relative) + 1 :].split("/")) == 3
            and _PART_FOLDER.match(parts[1])
        ]
        _delete_marker_first(mirror, keys)
    for folder in sorted(root.glob("*/*")):
        if folder.is_dir() and _PART_FOLDER.match(folder.name):
            (folder / _PART_MARKER).unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
    for folder in [*sorted(root.glob("*")), root]:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: nothing else is removed


def fetch_part(mirror: Mirror, kind: type[Any], folder: Path) -> None:
    """The part of ``kind`` in ``folder`` from the bucket, when it holds one whole: its
    ``part.json`` (put last), then the tables it does not hold, then ``part.json`` here. A part
    the bucket lost meanwhile (another machine replaced it) is left to be made here."""
    relative = folder.relative_to(mirror.local).as_posix()
    marker = mirror.remote.get(f"{relative}/{_PART_MARKER}")
    if marker is None:
        return
    try:
        held = set(json.loads(marker))
        tables = [f.name for f in fields(kind) if f.name not in held]
    except (ValueError, TypeError):
        return  # not a part this module wrote: made here, and uploaded over it
    listed = mirror.remote.list(relative)
    names = [f"{name}.parquet" for name in tables]
    if any(f"{relative}/{name}" not in listed for name in names):
        return
    try:
        for name in names:
            mirror.remote.download(f"{relative}/{name}", folder / name)
    except FileNotFoundError:  # replaced meanwhile (a store that cannot be reached: said)
        shutil.rmtree(folder, ignore_errors=True)
        return
    write_bytes_atomic(folder / _PART_MARKER, marker)


def _read_part(kind: type[T], folder: Path) -> T:
    values: dict[str, Any] = json.loads((folder / "part.json").read_text())
    for f in fields(kind):  # type: ignore[arg-type]
        if f.name not in values:
            path = folder / f"{f.name}.parquet"
            if "LazyFrame" in str(f.type):
                pl.read_parquet_schema(path)  # there and whole, read when merged
                values[f.name] = pl.scan_parquet(path)
            else:
                values[f.name] = pl.read_parquet(path)
    return kind(**values)


# -- the quarter from its days -----------------------------------------------------------------


@dataclass(frozen=True)
class DailyParts:
    """A workload's days, in order, and where their parts are kept."""

    sources: Sequence[DaySource]
    store: PartStore


@dataclass
class DailyFigures:
    """What :func:`merged_figures` gives ``compute_shape``: the sections of
    ``workload_shape.json`` it measures (``mix``: tenants, models, features, provider cache),
    and the merged counts the plots read."""

    arrivals: dict[str, Any]
    lengths: dict[str, Any]
    concurrency: ConcurrencyResult
    sessions: dict[str, Any]
    mix: dict[str, Any]
    length_counts: dict[str, pl.DataFrame]
    seconds: SecondCounts


@dataclass(frozen=True)
class SecondCounts:
    """:class:`~pipeline.shape.arrivals.ArrivalCounts` from requests per epoch second."""

    seconds: pl.DataFrame  # s, n

    def per_bucket(self, bucket_us: int, lo: int, hi: int) -> pl.LazyFrame:
        if bucket_us % US_PER_S:
            raise ValueError(f"SecondCounts: a {bucket_us} µs bucket is not whole seconds")
        return (
            self.seconds.lazy()
            .select((pl.col("s") // (bucket_us // US_PER_S)).alias("b"), "n")
            .filter(pl.col("b").is_between(lo, hi))
            .group_by("b")
            .agg(pl.col("n").sum().cast(pl.UInt32).alias("c"))
        )

    def per_calendar(self, unit: str, start_us: int, end_us: int) -> pl.DataFrame:
        day = pl.col("s") // 86_400
        # 1970-01-01 was a Thursday (ISO weekday 4).
        expr = (pl.col("s") // 3_600) % 24 if unit == "hour" else (day + 3) % 7 + 1
        return (
            self.seconds.filter(
                pl.col("s").is_between(start_us // US_PER_S, end_us // US_PER_S, closed="left")
            )
            .group_by(expr.cast(pl.Int32).alias(unit))
            .agg(pl.col("n").sum().cast(pl.UInt32).alias("n"))
        )


def _summed(tables: Sequence[pl.DataFrame], key: str, value: str) -> pl.DataFrame:
    return pl.concat(tables).group_by(key).agg(pl.col(value).sum())


def merged_figures(
    sources: Sequence[DaySource], latency: LatencyModel, store: PartStore, plot_points: int
) -> DailyFigures | None:
    """The quarter's figures from its days' parts (read back or computed; see the module
    docstring); None when the quarter cannot be put together from days (its plot width is
    finer than ``FINE_US``), for the caller to measure it otherwise."""
    days = [(s, counted_day(s, store)) for s in sources]
    kept = [(s, c) for s, c in days if c is not None]
    if not kept:
        raise ShapeError("request table is empty: nothing to measure")
    counts = [c for _, c in kept]
    timestamps = _timestamps(kept, store)
    sweep = _concurrency([s for s, _ in kept], counts[0].first_us, latency, store, plot_points)
    if sweep is None:
        return None
    first, last = counts[0], counts[-1]
    n = sum(c.requests for c in counts)
    seconds = SecondCounts(_summed([c.seconds for c in counts], "s", "n").sort("s"))
    basics = basics_of(n, at_us(first.first_us), at_us(last.last_us))
    lengths_by = {
        col: _summed([getattr(c, col) for c in counts], "value", "n")
        for col in ("prompt_tokens", "output_tokens")
    }
    output = distribution_of_counts(lengths_by["output_tokens"])
    features = _added([c.features for c in counts])
    features["lora_distinct"] = pl.concat([c.lora for c in counts]).n_unique()
    return DailyFigures(
        arrivals=arrival_metrics_of(basics, timestamps, seconds, MIN_QUANTA_PER_WINDOW),
        lengths={
            "prompt_tokens": distribution_of_counts(lengths_by["prompt_tokens"]),
            "output_tokens": {**output, "logged": output["count"] > 0},
            "long_context": long_context_of(lengths_by["prompt_tokens"]),
        },
        concurrency=sweep,
        sessions=_sessions(counts),
        mix={
            "tenants": _category(counts, "tenant", n, TOP_CATEGORIES),
            "models": _category(counts, "model", n, MAX_MODELS_LISTED),
            "features": features_of(features),
            "provider_cache": provider_cache_of(_added([c.provider for c in counts])),
        },
        length_counts=lengths_by,
        seconds=seconds,
    )


@dataclass(frozen=True)
class SweptDays:
    """The days a quarter's sweep reads: those with requests, and the first one's arrival
    (µs), found with one small query a day (:meth:`of`), not from the days' counts: the
    concurrency by engine runs beside the shape stage, which makes those."""

    sources: Sequence[DaySource]
    t0: int

    @classmethod
    def of(cls, sources: Sequence[DaySource]) -> SweptDays:
        found, t0 = [], None
        for source in sources:
            n, nulls, first = collect(
                source.requests.select(
                    pl.len(), pl.col("arrival").null_count().alias("nulls"), arrival_us().min()
                )
            ).row(0)
            if nulls:
                raise ShapeError(f"request table: {nulls} rows have a null 'arrival'")
            if n:
                found.append(source)
                t0 = first if t0 is None else t0
        if t0 is None:
            raise ShapeError("request table is empty: nothing to measure")
        return cls(found, int(t0))


def merged_concurrency(
    days: SweptDays, latency: LatencyModel, sweeps: PartStore, plot_points: int
) -> ConcurrencyResult | None:
    """The quarter's concurrency sweep under ``latency`` from its ``days``' (each day's sweep
    kept in ``sweeps``, one latency model's store), as :func:`merged_figures` puts it
    together; None when the plot width is finer than ``FINE_US``."""
    return _concurrency(days.sources, days.t0, latency, sweeps, plot_points)


def _added(rows: Sequence[dict[str, int]]) -> dict[str, int]:
    return {k: sum(r[k] for r in rows) for k in rows[0]}


def _category(counts: Sequence[DayCounts], column: str, n: int, top: int) -> dict[str, Any]:
    tables = [getattr(c, column) for c in counts]
    return category_of(_summed(tables, column, "requests"), column, n, top)


def _timestamps(kept: Sequence[tuple[DaySource, DayCounts]], store: PartStore) -> TimestampFigures:
    """:class:`TimestampFigures` from the days' distinct instants (and the gaps across each
    midnight, from one day's last instant to the next day's first)."""
    counts = [c for _, c in kept]
    n = sum(c.requests for c in counts)
    k = sum(c.distinct for c in counts)
    tie_rows = sum(c.tie_rows for c in counts)
    across = [b.first_us - a.last_us for a, b in pairwise(counts)]
    inside = [c.min_gap for c in counts if c.min_gap is not None]
    first, last = counts[0].first_us, counts[-1].last_us
    if not across and not inside:
        quant = quantisation(n, k, tie_rows, None)
        return TimestampFigures(quant, lambda: inter_arrival_of(n, k, first, last, 0.0, None, None))
    q0 = min(across + inside)
    gaps = [
        _present(store.get(DayGaps, s, str(q0), partial(day_gaps, s.requests, q0))) for s, _ in kept
    ]
    mean = (last - first) / (n - 1)
    # Σ (g − mean)² over the distinct gaps: each day's about its own mean, moved to the
    # quarter's (Chan et al.), and the gaps across midnight.
    ss = 0.0
    for g in gaps:
        if g.gaps:
            ss += g.m2 + g.gaps * (g.sum_g / g.gaps - mean) ** 2
    ss += sum((a - mean) ** 2 for a in across)
    across_gaps = pl.DataFrame({"g": across}, schema={"g": pl.Int64})
    grid = sum(g.grid for g in gaps) + int(across_gaps.select(grid_fit(q0).sum()).item())
    biggest = [(g.gmax, -g.gmax_at) for g in gaps if g.gmax is not None and g.gmax_at is not None]
    biggest += [(a, -prev.last_us) for a, prev in zip(across, counts, strict=False)]
    gmax, neg_at = max(biggest)
    units = [g.units.cast({"n": pl.UInt32}) for g in gaps]
    units.append(across_gaps.filter(unit_gap(q0)).group_by("g").agg(pl.len().alias("n")))
    fit = GridFit(q0, gmax, grid / (k - 1), median_of_counts(units), all(g.on_grid for g in gaps))
    quant = quantisation(n, k, tie_rows, fit)
    return TimestampFigures(quant, lambda: inter_arrival_of(n, k, first, last, ss, gmax, -neg_at))


def _concurrency(
    sources: Sequence[DaySource],
    t0: int,
    latency: LatencyModel,
    store: PartStore,
    plot_points: int,
) -> ConcurrencyResult | None:
    """The quarter's sweep from the days' (``sources``: the days with requests, the first
    arriving at ``t0`` µs; each day swept from the ends carried into it), the ends carried
    past the last day swept at the end; None when the plot width is finer than ``FINE_US``."""
    sweeps: list[DaySweep] = []
    carried = np.zeros(0, dtype=np.int64)
    from_us = sources[0].start_us
    for source in sources:
        until = source.start_us + DAY_US
        key = f"{asdict(latency)}|{carry_key(from_us, carried)}"
        make = partial(day_sweep, source.requests, latency, from_us, until, carried)
        sweep = _present(store.get(DaySweep, source, key, make))
        sweeps.append(sweep)
        carried = sweep.carried["end_us"].to_numpy()
        from_us = until
    t1 = max(s.t1 for s in sweeps)
    width = nice_width_us(t1 - t0 + 1, plot_points)
    if width % FINE_US:
        return None
    g0 = t0 // width * width
    grid = EnvelopeGrid(g0, width, (t1 - g0) // width + 1)
    peak = PartPeak(np.iinfo(np.int64).min, 0)
    for s in sweeps:
        _fold_fine(grid, s.from_us, s.fine["hi"].to_numpy(), s.fine["lo"].to_numpy())
        if s.peak_level > peak.level:
            peak = PartPeak(s.peak_level, s.peak_at)
    if g0 < sweeps[0].from_us:  # before the first day: nothing in flight
        zero = np.zeros(1, dtype=np.int64)
        _fold_fine(grid, g0, zero, zero)
    if carried.size:
        tail = EnvelopeGrid(from_us, FINE_US, (t1 - from_us) // FINE_US + 1)
        empty = np.zeros(0, dtype=np.int64)
        sweep_part(empty, empty, carried, None, tail)
        _fold_fine(grid, from_us, tail.hi, tail.lo)
    logged = sum(s.logged for s in sweeps)
    estimated = sum(s.estimated for s in sweeps)
    busy = sum(s.busy_us for s in sweeps)
    return concurrency_result(peak, busy, t0, t1, logged, estimated, latency, grid)


def _fold_fine(
    grid: EnvelopeGrid, origin: int, hi: npt.NDArray[np.int64], lo: npt.NDArray[np.int64]
) -> None:
    """Fold buckets of ``FINE_US`` from ``origin`` into ``grid`` (those it covers)."""
    starts = origin + FINE_US * np.arange(hi.size, dtype=np.int64)
    inside = (starts >= grid.origin) & (starts < grid.origin + grid.width * grid.buckets)
    grid.fold(starts[inside], hi[inside], np.maximum)
    grid.fold(starts[inside], lo[inside], np.minimum)


# Session-day rows merged at once (a hash group of sessions: every day of a session in one).
SESSION_GROUP_ROWS = 4_000_000


def _sessions(counts: Sequence[DayCounts]) -> dict[str, Any]:
    """``sessions`` of ``workload_shape.json`` from the days' sessions: the steps from a
    session's last turn on one day to its first on a later day are added here, a hash group
    of sessions at a time (:func:`pipeline.spill.hash_groups`)."""
    rows = sum(c.session_rows for c in counts)
    if rows == 0:
        return {"known": False, "reason": "no session_id logged"}
    gaps = SketchedDistribution(QuantileSketch(), 0.0)
    for c in counts:
        gaps.sketch.merge(sketch_of(c.gap_sketch))
        gaps.total += c.gap_total
    growths = [c.growth for c in counts]
    negative = sum(c.negative_steps for c in counts)
    turn_counts, sessions, multi = [], 0, 0
    same = pl.col("session_id") == pl.col("session_id").shift()
    by_day = [c.sessions.with_columns(pl.lit(i).alias("day")) for i, c in enumerate(counts)]
    session_days = sum(collect(c.sessions.select(pl.len())).item() for c in counts)
    groups = max(1, -(-session_days // SESSION_GROUP_ROWS))
    with hash_groups(by_day, "session_id", groups, "enginefit-sessions-") as members_by_group:
        for members in members_by_group:
            per_day = collect(members.sort(["session_id", "day"], maintain_order=True))
            if per_day.height == 0:
                continue
            across = per_day.select(
                pl.when(same)
                .then((pl.col("first_t") - pl.col("last_t").shift()) / US_PER_S)
                .alias("gap_s"),
                pl.when(same)
                .then(pl.col("first_prompt") - pl.col("last_prompt").shift())
                .alias("growth"),
            )
            turns = per_day.group_by("session_id").agg(pl.col("turns").sum())["turns"]
            sessions += turns.len()
            multi += int((turns > 1).sum())
            turn_counts.append(turns.value_counts().rename({"turns": "value", "count": "n"}))
            gaps.add(across["gap_s"])
            growths.append(
                across.select(pl.col("growth").drop_nulls().alias("value"))
                .group_by("value")
                .len("n")
            )
            negative += int((across["growth"] < 0).sum())
    return {
        "known": True,
        "rows_with_session": rows,
        "sessions": sessions,
        "turns_per_session": distribution_of_counts(_summed(turn_counts, "value", "n")),
        "multi_turn_sessions": multi,
        "inter_turn_gap_s": gaps.as_dict(),
        "history_growth_tokens": {
            **distribution_of_counts(_summed(growths, "value", "n")),
            "negative_steps": negative,
        },
    }


def plot_cdfs(figures: DailyFigures, plot_points: int) -> dict[str, pl.DataFrame]:
    """The length CDFs from the merged counts."""
    return {
        name: cdf_of_counts(figures.length_counts[column], plot_points)
        for name, column in (("prompt", "prompt_tokens"), ("output", "output_tokens"))
    }
