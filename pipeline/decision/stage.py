"""The decision stage: read_inputs → run → write, shared by the ``engine_decision`` asset and
``enginefit decide``.

It reads only typed stage results through the layout (:data:`STEP`'s upstream: shape, prefix,
simulation, bench, the latency fits and capacity), the engine catalog its section names, the
bench section's report date and policies, and the team's requirements; a stage that has not run
is recorded as missing with its reason, and the rules that needed it say ``unknown``. Every file
read is listed with its sha256 in the record's ``inputs``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import polars as pl

from pipeline import dates, results
from pipeline.bench import stage as bench_stage
from pipeline.bench.config import BenchPolicy
from pipeline.capacity import stage as capacity_stage
from pipeline.dates import refuse_future, refuse_runs_after
from pipeline.decision.catalog import Catalog, load_catalog
from pipeline.decision.compute import decide
from pipeline.decision.config import DecisionConfig
from pipeline.decision.context import DecisionInputs
from pipeline.decision.present import rationale_text, triggers_frame
from pipeline.decision.result import DecisionRecord, record_schema
from pipeline.decision.triggers import refuse_unordered_triggers
from pipeline.digests import sha256_file
from pipeline.errors import InputFormatError, StageOutputMissingError
from pipeline.ingest.stage import read_summary
from pipeline.layout import WorkloadLayout
from pipeline.ledger import RECORD, Filing
from pipeline.prefix import stage as prefix_stage
from pipeline.safe_read import read_json
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage
from pipeline.store import (
    open_stage_output,
    read_requests,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

# The files of each upstream result listed are the ones the record fingerprints, in this order;
# the ingest summary only dates the quarter whose previous version the record checks.
STEP = results.Step(
    results.DECISION,
    upstream=(
        results.SHAPE,
        results.PREFIX,
        results.SCENARIOS,
        results.CURVES,
        results.BENCH,
        results.LATENCY_FITS,
        results.CAPACITY,
        results.REQUESTS,
        results.INGEST_SUMMARY.reading(),
    ),
    sections=("decision", "requirements", "bench", "report", "paths"),
)
TRIGGERS_STEP = results.Step(results.TRIGGERS, upstream=(results.DECISION,))
STEPS = (STEP, TRIGGERS_STEP)

T = TypeVar("T")


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
    record = DecisionRecord.from_json(data, str(path))
    refuse_unordered_triggers(record, str(path))
    return record


def refuse_previous_after(previous: DecisionRecord, path: Path, as_of: dt.date) -> None:
    """A previous record dated after this decision's date is not a previous one: its triggers
    would be checked against traffic older than they were set on."""
    try:
        dated = dt.date.fromisoformat(previous.as_of) if previous.as_of else None
    except ValueError as exc:
        raise InputFormatError(
            f"{path}: as_of: {previous.as_of!r} is not an ISO date (YYYY-MM-DD)"
        ) from exc
    if dated is not None and dated > as_of:
        raise InputFormatError(
            f"{path}: a decision record as of {dated}, after this decision's date {as_of}: give "
            "the record of an earlier decision, or set the report date (--as-of or bench.as_of)"
        )


def published_previous(layout: WorkloadLayout, filing: Filing) -> Path | None:
    """The decision record of the version a new report would compare with (the quarter's latest
    published version, else the previous quarter's), so each run checks the last one's
    triggers without being told; None before the first report."""

    try:
        quarter = filing.quarter_for(read_summary(layout).last_arrival)
    except InputFormatError:
        return None
    entry = filing.tree.compared_with(quarter)
    if entry is None:
        return None
    record = filing.tree.root / entry.path / RECORD
    if not record.exists():
        raise InputFormatError(
            f"{filing.tree.ledger}: a ghost entry: it lists version {entry.path}, but "
            f"{record} does not exist (the version was moved or deleted); restore it, or name "
            "the record to compare with in decision.previous_record"
        )
    return record


def read_inputs(
    layout: WorkloadLayout,
    settings: DecisionConfig,
    policy: BenchPolicy,
    *,
    filing: Filing | None = None,
    previous: Path | None = None,
) -> DecisionInputs:
    """The upstream results (:data:`STEP`), the catalog ``settings`` names, the report date
    ``policy`` gives (else today's), and a previous record whose triggers to check: the one
    given, else the one a new report of ``filing`` would compare with (none without it)."""
    missing: dict[str, str] = {}

    def optional(result: results.Result, read: Callable[[], T], stage: str) -> T | None:
        """``read()``, or None with the reason when its stage has not run; an output that
        exists but cannot be read is an error (a different decision must never follow from
        damage)."""
        try:
            return result.read(layout, read)
        except StageOutputMissingError as exc:
            missing[stage] = str(exc)
            return None

    shape = optional(results.SHAPE, lambda: shape_stage.read_result(layout).metrics, "shape")
    prefix = optional(results.PREFIX, lambda: prefix_stage.read_result(layout).summary, "prefix")
    scenarios = optional(results.SCENARIOS, lambda: sim_stage.read_summaries(layout), "simulation")
    curves = optional(results.CURVES, lambda: sim_stage.read_curves(layout), "curves")
    bench = optional(results.BENCH, lambda: bench_stage.read_analysis(layout), "bench")
    fits = optional(
        results.LATENCY_FITS, lambda: bench_stage.read_latency_fits(layout), "latency_fits"
    )
    capacity = optional(results.CAPACITY, lambda: capacity_stage.read_result(layout), "capacity")
    lengths = optional(results.REQUESTS, lambda: _lengths(layout), "requests") if capacity else None
    if bench is not None and bench.capacity.is_empty() and bench.notes:
        missing["bench"] = bench.notes[0]
    read = results.fingerprints(STEP, layout)
    digests = {str(p.relative_to(layout.root)): sha256_file(p) for p in read if p.exists()}
    catalog = load_catalog(settings.catalog)
    catalog_source = (
        str(settings.catalog) if settings.catalog else "bundled: pipeline/decision/engines.yaml"
    )
    # The report date (pipeline.dates): given, else the clock's; nothing read may be dated after.
    as_of = policy.as_of or dates.today()
    refuse_catalog_in_future(catalog, catalog_source)
    if bench is not None:
        refuse_runs_after(bench.evaluated, as_of, "the report date")
    if previous is None and filing is not None:
        previous = published_previous(layout, filing)
    previous_record = read_previous(previous) if previous is not None else None
    if previous is not None and previous_record is not None:
        refuse_previous_after(previous_record, previous, as_of)
    workload = layout.name
    if previous_record is not None and previous_record.workload != workload:
        raise InputFormatError(
            f"{previous}: a decision record of workload {previous_record.workload!r}, not "
            f"{workload!r}: its triggers measure other traffic; give this workload's record"
        )
    if previous is not None:
        digests["previous:" + str(previous)] = sha256_file(previous)
    return DecisionInputs(
        workload_name=workload,
        shape=shape,
        prefix=prefix,
        scenarios=scenarios,
        curves=curves,
        bench=bench,
        fits=fits,
        catalog=catalog,
        catalog_source=catalog_source,
        as_of=as_of,
        peak_window=policy.peak_window,
        max_age_days=policy.max_age_days,
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


#: The stage's pure step (every stage has read_inputs → run → write).
run = decide


def write_record(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """The record, its JSON Schema and the plain-text rationale (the ``engine_decision`` asset)."""
    open_stage_output(layout)
    paths = layout.decision
    write_json_atomic(paths.record, record.to_json())
    write_json_atomic(paths.schema, record_schema())
    write_bytes_atomic(paths.rationale, rationale_text(record).encode("utf-8"))
    written = {"record": paths.record, "schema": paths.schema, "rationale": paths.rationale}
    results.DECISION.seal(layout, written.values())
    return written


def write_triggers(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """The triggers table, this record's and the previous record's evaluated now (the
    ``revisit_triggers`` asset)."""
    open_stage_output(layout)
    write_parquet_atomic(triggers_frame(record), layout.decision.triggers)
    results.TRIGGERS.seal(layout, [layout.decision.triggers])
    return {"triggers": layout.decision.triggers}


def write(record: DecisionRecord, layout: WorkloadLayout) -> dict[str, Path]:
    """Every decision output (the command's path)."""
    return write_record(record, layout) | write_triggers(record, layout)


def read_record(layout: WorkloadLayout) -> DecisionRecord:
    path = results.DECISION.require(layout)
    return DecisionRecord.from_json(read_json(path), str(path))
