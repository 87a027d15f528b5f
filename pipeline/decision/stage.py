"""The decision stage: read_inputs → run → write, shared by the ``engine_decision`` asset and
``enginefit decide``.

It reads only typed stage results through the layout (shape, prefix, simulation, bench and the
latency fits), the engine catalog and the configuration; a stage that has not run is recorded
as missing with its reason, and the rules that needed it say ``unknown``. Every file read is
listed with its sha256 in the record's ``inputs``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import polars as pl

from pipeline import dates
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import configured_as_of
from pipeline.capacity import stage as capacity_stage
from pipeline.config import Config
from pipeline.dates import refuse_future, refuse_runs_after
from pipeline.decision.catalog import Catalog
from pipeline.decision.compute import decide
from pipeline.decision.context import DecisionInputs
from pipeline.decision.present import rationale_text, triggers_frame
from pipeline.decision.result import DecisionRecord, record_schema
from pipeline.errors import InputFormatError
from pipeline.ingest.stage import read_requests, read_summary
from pipeline.layout import WorkloadLayout, require_output
from pipeline.prefix import stage as prefix_stage
from pipeline.report.versions import RECORD, report_quarter, report_tree
from pipeline.safe_read import read_json
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage
from pipeline.store import (
    open_stage_output,
    sha256_file,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

T = TypeVar("T")


def _optional(read: Callable[[], T], stage: str, missing: dict[str, str]) -> T | None:
    try:
        return read()
    except InputFormatError as exc:
        missing[stage] = str(exc)
        return None


def read_previous(path: Path) -> DecisionRecord:
    """A decision record read back (a previous quarter's, or any published version's)."""
    if path.is_dir():
        raise InputFormatError(
            f"{path}: is a folder; give its decision.json (a published version holds one)"
        )
    try:
        data = read_json(path)
    except FileNotFoundError as exc:
        raise InputFormatError(f"{path}: decision record not found") from exc
    return DecisionRecord.from_json(data, str(path))


def published_previous(layout: WorkloadLayout, config: Config) -> Path | None:
    """The decision record of the version a new report would compare with (the quarter's latest
    published version, else the previous quarter's), so each run checks the last one's
    triggers without being told; None before the first report."""

    try:
        quarter = report_quarter(config, read_summary(layout).last_arrival)
    except InputFormatError:
        return None
    tree = report_tree(config)
    entry = tree.compared_with(quarter)
    return None if entry is None else tree.root / entry.path / RECORD


def read_inputs(
    layout: WorkloadLayout,
    config: Config,
    *,
    as_of: dt.date | None = None,
    previous: Path | None = None,
) -> DecisionInputs:

    missing: dict[str, str] = {}
    shape = _optional(lambda: shape_stage.read_result(layout).metrics, "shape", missing)
    prefix = _optional(lambda: prefix_stage.read_result(layout).summary, "prefix", missing)
    scenarios = _optional(lambda: sim_stage.read_summaries(layout), "simulation", missing)
    curves = _optional(lambda: sim_stage.read_curves(layout), "curves", missing)
    bench = _optional(lambda: bench_stage.read_analysis(layout, config.bench), "bench", missing)
    fits = _optional(lambda: bench_stage.read_latency_fits(layout), "latency_fits", missing)
    # The capacity stage reads the bench and simulation stages; loaded only here, no cycle forms.
    capacity = _optional(lambda: capacity_stage.read_result(layout), "capacity", missing)
    lengths = _optional(lambda: _lengths(layout), "requests", missing) if capacity else None
    if bench is not None and bench.capacity.is_empty() and bench.notes:
        missing["bench"] = bench.notes[0]
    read = [
        layout.shape.summary,
        layout.prefix.summary,
        layout.prefix.curve,
        layout.simulation.summary,
        layout.simulation.curves,
        layout.bench.analysis,
        layout.bench.capacity,
        layout.bench.fleet,
        layout.bench.findings,
        layout.bench.points,
        layout.bench.concurrency_json,
        layout.root / "capacity" / "capacity.json",
    ]
    digests = {str(p.relative_to(layout.root)): sha256_file(p) for p in read if p.exists()}
    catalog_path = config.decision.catalog
    catalog = config.catalog()
    catalog_source = (
        str(catalog_path) if catalog_path else "bundled: pipeline/decision/engines.yaml"
    )
    # The report date (pipeline.dates): given, else the clock's; nothing read may be dated after.
    if as_of is None:
        as_of = configured_as_of(config.bench)[0] or dates.today()
    refuse_catalog_in_future(catalog, catalog_source)
    if bench is not None:
        refuse_runs_after(bench.evaluated, as_of, "the report date")
    if previous is None:
        previous = published_previous(layout, config)
    previous_record = read_previous(previous) if previous is not None else None
    workload = config.require_workload().name
    if previous_record is not None and previous_record.workload != workload:
        raise InputFormatError(
            f"{previous}: a decision record of workload {previous_record.workload!r}, not "
            f"{workload!r}: its triggers measure other traffic; give this workload's record"
        )
    if previous is not None:
        digests["previous:" + str(previous)] = sha256_file(previous)
    return DecisionInputs(
        workload_name=config.require_workload().name,
        shape=shape,
        prefix=prefix,
        scenarios=scenarios,
        curves=curves,
        bench=bench,
        fits=fits,
        catalog=catalog,
        catalog_source=catalog_source,
        as_of=as_of,
        peak_window=config.bench.peak_window,
        digests=digests,
        missing=missing,
        previous=previous_record,
        capacity=capacity,
        lengths=lengths,
    )


def refuse_catalog_in_future(catalog: Catalog, source: str) -> None:
    """The catalog's edition and each status change must be no later than today (a date from
    the future would pass as fresh); every fact's evidence date is no later than the edition
    (the catalog's own validation). One later than an earlier report date is allowed: the
    report says so in words."""
    statuses = [(f"engines.{k}", e.status) for k, e in sorted(catalog.engines.items())]
    statuses += [(f"layers.{k}", e.status) for k, e in sorted(catalog.layers.items())]
    dates = [("as_of", catalog.as_of)]
    dates += [(f"{key}.status.since", s.since) for key, s in statuses if s.since is not None]
    for key, value in dates:
        refuse_future(value, f"{source}: {key}")


def _lengths(layout: WorkloadLayout) -> pl.DataFrame:
    """Prompt and output tokens per request (what routing is priced on through the model)."""
    return read_requests(layout).select("prompt_tokens", "output_tokens").collect()


def run(inputs: DecisionInputs, config: Config) -> DecisionRecord:
    return decide(inputs, config.requirements, config.decision)


def write_record(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """The record, its JSON Schema and the plain-text rationale (the ``engine_decision`` asset)."""
    open_stage_output(layout)
    paths = layout.decision
    write_json_atomic(paths.record, record.to_json())
    write_json_atomic(paths.schema, record_schema())
    write_bytes_atomic(paths.rationale, rationale_text(record).encode("utf-8"))
    return {"record": paths.record, "schema": paths.schema, "rationale": paths.rationale}


def write_triggers(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """The triggers table, this record's and the previous record's evaluated now (the
    ``revisit_triggers`` asset)."""
    open_stage_output(layout)
    write_parquet_atomic(triggers_frame(record), layout.decision.triggers)
    return {"triggers": layout.decision.triggers}


def write(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """Every decision output (the command's path)."""
    return write_record(record, layout) | write_triggers(record, layout)


def read_record(layout: WorkloadLayout) -> DecisionRecord:
    path = require_output(layout.decision.record, "decision record", "decide", "engine_decision")
    return DecisionRecord.from_json(read_json(path), str(path))
