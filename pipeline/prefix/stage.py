"""The prefix stage: read_inputs → run → write, shared by the ``prefix_sharing`` asset and
``enginefit prefix``; ``read_result`` is how later stages read it back.

Outputs (paths: :class:`pipeline.layout.PrefixPaths`): the summary (keys in
``docs/prefix.md``), the curve and the sessions as Parquet, and the curve as SVG.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import results
from pipeline.layout import WorkloadLayout
from pipeline.prefix.analysis import analyse, slices
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.days import analyse_days, forget_passes
from pipeline.prefix.present import curve_svg
from pipeline.prefix.result import PrefixResult
from pipeline.resume import DayPasses
from pipeline.safe_read import read_json
from pipeline.store import (
    copy_parquet_atomic,
    open_stage_output,
    read_requests,
    release_input,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

STEP = results.Step(results.PREFIX, upstream=(results.REQUESTS,), sections=("prefix",))


@dataclass(frozen=True)
class PrefixInputs:
    """The canonical table, sorted by arrival, as a query: ``run`` reads it in chunks (the
    columns each step needs), so the table is never in memory whole. ``sessions_to``: the
    sessions file the result will be written to, beside which a large table's sessions are
    written as they are found (None: kept in memory). ``daily``: the workload's days, when it
    is a union of them (each pass is then carried on from the days read before,
    :mod:`pipeline.prefix.days`); ``said`` gets one line a pass on what was carried on."""

    requests: pl.LazyFrame
    sessions_to: Path | None = None
    daily: DayPasses | None = None
    said: list[str] = field(default_factory=list, compare=False)


def inputs_from(
    requests: pl.LazyFrame | pl.DataFrame, layout: WorkloadLayout | None = None
) -> PrefixInputs:
    """The inputs of a table (scanned or in memory), sorted by arrival when it is not (the
    check reads the arrivals alone; canonical tables are sorted at ingest), for results
    written to ``layout`` (if any)."""
    sessions_to = layout.prefix.sessions if layout is not None else None
    if isinstance(requests, pl.DataFrame):
        if not requests["arrival"].is_sorted():
            requests = requests.sort("arrival", maintain_order=True)
        return PrefixInputs(requests.lazy(), sessions_to)
    if _backwards(requests):
        requests = requests.sort("arrival", maintain_order=True)
    return PrefixInputs(requests, sessions_to)


def _backwards(requests: pl.LazyFrame) -> bool:
    """Some arrival comes before the one above it (the arrivals read a slice at a time)."""
    last = None
    for part in slices(requests, ("arrival",)):
        arrival = part["arrival"].dt.epoch("us").drop_nulls()
        if arrival.len() == 0:
            continue
        if not arrival.is_sorted() or (last is not None and arrival[0] < last):
            return True
        last = arrival[-1]
    return False


def read_inputs(layout: WorkloadLayout) -> PrefixInputs:
    """The workload's table; read day by day when it is a union of days (its parts in arrival
    order), else whole (and the passes kept for its days before, if any, removed)."""
    requests = read_requests(layout)  # none ingested yet: said here, naming what makes it
    daily = DayPasses.of(layout, layout.prefix_passes)
    if daily is None:
        forget_passes(layout.prefix_passes, layout.remote)
        return inputs_from(requests, layout)
    return PrefixInputs(requests, layout.prefix.sessions, daily)


def run(inputs: PrefixInputs, settings: PrefixConfig) -> PrefixResult:
    # What an earlier stage of this process kept (the simulation's flattened workload, in an
    # in-process Dagster run) is let go of, not held beside this stage's tables.
    release_input()
    if inputs.daily is not None:
        result = analyse_days(inputs.daily, settings)
        inputs.said.extend(inputs.daily.said)
        return result
    return analyse(inputs.requests, settings, inputs.sessions_to)


def write(result: PrefixResult, layout: WorkloadLayout) -> dict[str, Path]:
    """The four files, each written atomically; returns them by layout name."""
    open_stage_output(layout)
    paths = layout.prefix
    write_json_atomic(paths.summary, result.to_json())
    write_parquet_atomic(result.curve, paths.curve)
    if result.sessions_files:
        copy_parquet_atomic(result.sessions_files, paths.sessions)
    else:
        write_parquet_atomic(result.sessions.collect(), paths.sessions)
    write_bytes_atomic(paths.curve_svg, curve_svg(result.curve))
    results.PREFIX.seal(layout, paths.files().values())
    return paths.files()


def read_result(layout: WorkloadLayout) -> PrefixResult:
    """The result as written; its sessions a scan of the file (nothing of it read yet)."""
    paths = layout.prefix
    return PrefixResult.from_json(
        read_json(results.PREFIX.require(layout)),
        pl.read_parquet(paths.curve),
        pl.scan_parquet(paths.sessions),
    )
