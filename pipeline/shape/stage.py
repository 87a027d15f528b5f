"""The shape stage: read_inputs → run → write, shared by the ``workload_shape`` asset and
``enginefit shape``; ``read_result`` is how later stages read it back.

Outputs (paths: :class:`pipeline.layout.ShapePaths`): the metrics document, the workload facts,
the downsampled concurrency envelope and three figures.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import results
from pipeline.digests import sha256_file
from pipeline.errors import ConfigError
from pipeline.ingest.days import held_day_set, union_day_sets
from pipeline.ingest.stage import read_summary
from pipeline.layout import WorkloadLayout
from pipeline.mirror import folders_below
from pipeline.remote import Mirror
from pipeline.safe_read import read_json
from pipeline.shape.common import json_safe, sketched
from pipeline.shape.compute import compute_shape, exact_limit
from pipeline.shape.concurrency import ConcurrencyResult, peak_concurrency
from pipeline.shape.config import ShapeConfig
from pipeline.shape.daily import (
    DailyParts,
    DaySource,
    PartStore,
    SweptDays,
    counted_day,
    forget_parts,
    merged_concurrency,
)
from pipeline.shape.facts import LatencyModel
from pipeline.shape.present import figures
from pipeline.shape.result import ShapeResult
from pipeline.store import (
    open_stage_output,
    read_requests,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

STEP = results.Step(results.SHAPE, upstream=(results.REQUESTS,), sections=("shape",))


@dataclass(frozen=True)
class ShapeInputs:
    """The request table and, for a workload published from days, its days and where their
    parts are kept (``<workload>/shape/days/``, :mod:`pipeline.shape.daily`)."""

    requests: pl.LazyFrame
    days: DailyParts | None = None


def read_inputs(layout: WorkloadLayout) -> ShapeInputs:
    requests = read_requests(layout)
    sources = union_days(layout, requests)
    if sources is None:
        return ShapeInputs(requests)
    return ShapeInputs(
        requests, DailyParts(sources, PartStore(layout.shape_day_parts, layout.remote))
    )


def union_days(layout: WorkloadLayout, requests: pl.LazyFrame) -> list[DaySource] | None:
    """The days of a workload published from days, in order, each with the digest of the set
    the union holds of it (None: not a union of days)."""
    held = union_day_sets(layout)
    if held is None:
        return None
    return [DaySource(day, day_of(requests, day), digest) for day, digest in sorted(held.items())]


def day_of(requests: pl.LazyFrame, day: str) -> pl.LazyFrame:
    """The requests of one UTC day (the union's parts are days: the scan reads that day's)."""
    start = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(), tzinfo=dt.UTC)
    return requests.filter(
        pl.col("arrival").is_between(start, start + dt.timedelta(days=1), closed="left")
    )


def count_day(layout: WorkloadLayout, day: str) -> str:
    """One day's counts (the bulk of a day's part, :func:`pipeline.shape.daily.counted_day`)
    computed and kept ahead of the stage, which reads them back: the step a backfill of the
    ``workload_shape_day`` partitions runs side by side. It reads the union's manifest and
    summary, and the day's requests from the set the union holds of it (the day's own, or
    its copy without the requests an earlier day has), not the quarter's table: on object
    storage a machine fetches that day alone (:func:`day_reads`). Returns what it did, in a
    line."""
    if not layout.ingest.manifest.is_file():
        raise ConfigError(
            f"{layout.ingest.manifest}: the workload's union of days is not written yet; "
            "materialise `workload` first"
        )
    held = union_day_sets(layout)
    if held is None:
        raise ConfigError(
            f"{layout.ingest.manifest}: the workload was not published from days (or by an "
            "enginefit before unions recorded their days' sets: materialise `workload` again); "
            "otherwise the shape is measured by `enginefit shape` (the workload_shape asset)"
        )
    rows, limit = read_summary(layout).ingested, exact_limit()
    if rows <= limit:
        return f"not needed: {rows:,} requests are measured as one table (up to {limit:,})"
    if day not in held:
        return f"{day}: not in the workload's union (not ingested yet)"
    source = held_day_set(layout, day)
    if not source.ingest.manifest.is_file():
        return (
            f"{day}: the set the union holds of it ({source.root}) is not on this machine; "
            "the workload_shape step counts it"
        )
    if sha256_file(source.ingest.manifest) != held[day]:
        raise ConfigError(
            f"{source.ingest.manifest}: the day's set changed after the workload's union was "
            "written; materialise `workload` first, then this day"
        )
    store = PartStore(layout.shape_day_parts, layout.remote)
    manifest, digest = source.ingest.manifest, held[day]
    day_source = DaySource(
        day, read_requests(source), digest, lambda: sha256_file(manifest) == digest
    )
    if counted_day(day_source, store) is None:
        return f"{day}: no request"
    return store.summary() or ""


def day_reads(layout: WorkloadLayout, day: str) -> dict[str, frozenset[str] | None]:
    """What :func:`count_day` reads of the workload folder, by commit marker (as
    :func:`pipeline.mirror.pull` takes it): the union's manifest and summary, and the day's
    own set whole."""
    union = layout.ingest
    return {
        union.manifest.relative_to(layout.root).as_posix(): frozenset({union.summary.name}),
        layout.day(day).ingest.manifest.relative_to(layout.root).as_posix(): None,
    }


def run(inputs: ShapeInputs, settings: ShapeConfig) -> ShapeResult:
    return compute_shape(inputs.requests, settings, days=inputs.days)


@dataclass
class ModelSweeps:
    """The trace's concurrency under one latency model after another (the configured one and
    each benchmark's fitted one, :mod:`pipeline.bench.latency_fit`). For a workload published
    from days, above the shape's exact limit, each model's figure is merged from the days'
    sweeps (:func:`pipeline.shape.daily.merged_concurrency`), each model's kept under
    ``<workload>/bench/days/<model digest>/``: a day appended later is swept alone under each
    model. Otherwise the whole table is swept
    (:func:`pipeline.shape.concurrency.peak_concurrency`)."""

    requests: pl.LazyFrame
    max_points: int
    days: Sequence[DaySource] | None  # the union's days (None: swept whole)
    root: Path  # a folder of sweeps a model
    remote: Mirror | None = None
    stores: dict[str, PartStore] = field(default_factory=dict)  # the models' asked for
    swept: SweptDays | None = None  # the days with requests, found at the first model

    @classmethod
    def of(cls, layout: WorkloadLayout, requests: pl.LazyFrame, max_points: int) -> ModelSweeps:
        days = union_days(layout, requests) if sketched(requests, exact_limit()) else None
        return cls(requests, max_points, days, layout.concurrency_day_parts, layout.remote)

    def __call__(self, model: LatencyModel) -> ConcurrencyResult:
        if self.days is not None:
            name = hashlib.sha256(repr(dataclasses.astuple(model)).encode()).hexdigest()[:16]
            store = self.stores.setdefault(name, PartStore(self.root / name, self.remote))
            if self.swept is None:
                self.swept = SweptDays.of(self.days)
            merged = merged_concurrency(self.swept, model, store, self.max_points)
            if merged is not None:
                return merged
        return peak_concurrency(self.requests, model, max_points=self.max_points)

    def settle(self) -> str | None:
        """Remove the sweeps of the models no longer asked for (here and in the bucket), and
        say in a line what was computed and read back (None: the table was swept whole)."""
        if self.days is None:
            return None
        names = folders_below(self.root, self.remote)
        for name in sorted(n for n in names if _MODEL_FOLDER.match(n) and n not in self.stores):
            forget_parts(self.root / name, self.remote)
        computed = sum(sum(s.computed.values()) for s in self.stores.values())
        read = sum(sum(s.read.values()) for s in self.stores.values())
        return (
            f"per-day sweeps of {len(self.stores)} latency model(s): {computed} computed, "
            f"{read} read back (kept in {self.root})"
        )


# A model's folder of sweeps (only such folders are removed).
_MODEL_FOLDER = re.compile(r"^[0-9a-f]{16}$")


def days_note(inputs: ShapeInputs) -> str | None:
    """After :func:`run`: how many per-day parts it computed and read back (None when it
    measured the table whole)."""
    return inputs.days.store.summary() if inputs.days is not None else None


def write(result: ShapeResult, layout: WorkloadLayout) -> dict[str, Path]:
    """Every output file, each written atomically; returns them by layout name."""
    open_stage_output(layout)
    paths = layout.shape
    written = {"summary": paths.summary, "facts": paths.facts, "concurrency": paths.concurrency}
    write_json_atomic(paths.summary, result.to_json())
    write_json_atomic(paths.facts, json_safe(result.facts.as_dict()))
    write_parquet_atomic(result.concurrency_series, paths.concurrency)
    if result.plots is not None:
        for name, svg in figures(result, result.plots).items():
            target = getattr(paths, name)
            write_bytes_atomic(target, svg)
            written[name] = target
    results.SHAPE.seal(layout, written.values())
    return written


def read_result(layout: WorkloadLayout) -> ShapeResult:
    """The shape result written for this workload (without the figures' data)."""
    paths = layout.shape
    metrics = read_json(results.SHAPE.require(layout))
    series = pl.read_parquet(paths.concurrency) if paths.concurrency.is_file() else None
    return ShapeResult.from_json(metrics, series)
