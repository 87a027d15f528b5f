"""The bench stage, shared by the ``bench_*`` assets and ``enginefit bench``.

Two steps, each read → run → write:

1. **results**: the configured result files (or the paths given) normalised to load points
   (:func:`read_results` → :func:`write_results`);
2. **analysis**: those load points joined with the workload's facts
   (:func:`read_inputs` → :func:`run` → :func:`write`): SLO status, capacity, cost, fleet,
   validity findings, figures; and the trace's concurrency re-estimated with latency models
   fitted at each candidate's capacity (:func:`run_concurrency` → :func:`write_concurrency`).

The workload facts come from the shape stage's result, with the prefix stage's shared-prefix
curve joined in when it ran; either missing is said (the checks that need it are then
``unknown``), never assumed. Paths: :class:`pipeline.layout.BenchPaths`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import dates, results
from pipeline.bench.compute import analyse_bench
from pipeline.bench.config import BenchConfig
from pipeline.bench.latency_fit import (
    CONCURRENCY_SCHEMA,
    concurrency_payload,
    estimate_concurrency,
    fit_latency_models,
)
from pipeline.bench.manifest import find_sidecar
from pipeline.bench.present import figures
from pipeline.bench.readers import read_bench_files
from pipeline.bench.result import AnalysisBasis, BenchResult, analysis_payload
from pipeline.bench.schema import BenchReadResult, empty_load_points
from pipeline.dates import refuse_runs_after
from pipeline.digests import sha256_file
from pipeline.errors import InputFormatError, StageOutputMissingError
from pipeline.layout import WorkloadLayout
from pipeline.prefix import stage as prefix_stage
from pipeline.safe_read import read_json
from pipeline.shape import stage as shape_stage
from pipeline.shape.facts import LatencyModel, WorkloadFacts
from pipeline.store import (
    open_stage_output,
    read_requests,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

# Each step's result, the results it reads and the sections it takes (the bench section, and the
# shape section's latency model for the trace's concurrency).
RESULTS_STEP = results.Step(results.LOAD_POINTS, sections=("bench",))
ANALYSIS_STEP = results.Step(
    results.BENCH,
    upstream=(results.LOAD_POINTS, results.SHAPE, results.PREFIX),
    sections=("bench",),
)
# The envelope's points the sweeps are made at (only the peak and mean are written).
CONCURRENCY_POINTS = 10
CONCURRENCY_STEP = results.Step(
    results.LATENCY_FITS, upstream=(results.BENCH, results.REQUESTS), sections=("shape",)
)
STEPS = (RESULTS_STEP, ANALYSIS_STEP, CONCURRENCY_STEP)

NO_RESULTS = (
    "no bench results configured (set bench.results in the configuration, or give result "
    "PATHs to `enginefit bench`)"
)


# ------------------------------------------------------------------------------ 1. results


def read_results(settings: BenchConfig, paths: Sequence[Path] | None = None) -> BenchReadResult:
    """``paths`` (else the configured ``bench.results``) read into load points; none configured
    gives an empty table with a note saying so."""
    chosen = list(paths) if paths is not None else list(settings.results)
    if not chosen:
        return BenchReadResult(empty_load_points(), None, [NO_RESULTS])
    for path in chosen:
        if not path.exists():
            raise InputFormatError(f"{path}: no such benchmark result file or folder")
    return read_bench_files(chosen, manifest=settings.manifest)


def bench_inputs(settings: BenchConfig) -> dict[str, str]:
    """What the bench stage's outputs are computed from, each as a digest: the bench section's
    settings (as the run took them, but the report date) and every file under each result path it names (with a
    result file's sidecar manifest, and the ``bench.manifest`` file). Files are named by their
    place under their configured path, so a project moved whole still fits. Sealed with the
    outputs, so a later stage that reads them knows when they no longer fit the
    configuration (:func:`require_current`)."""
    # The files stand for results and manifest; the report date is the run's (a flag or
    # ENGINEFIT_RUN_DATE may set it for one command), not what the outputs are matched on.
    section = settings.model_dump(mode="json", exclude={"results", "manifest", "as_of"})
    text = json.dumps(section, sort_keys=True, default=str)
    found = {"the bench section": hashlib.sha256(text.encode()).hexdigest()}
    files: dict[str, Path] = {}
    for i, path in enumerate(settings.results):
        if path.is_dir():
            for file in sorted(f for f in path.rglob("*") if f.is_file()):
                files[f"bench.results[{i}]/{file.relative_to(path).as_posix()}"] = file
        elif path.is_file():
            files[f"bench.results[{i}]"] = path
            sidecar = find_sidecar(path)
            if sidecar is not None:
                files[f"bench.results[{i}]'s manifest"] = sidecar
    if settings.manifest is not None and settings.manifest.is_file():
        files["bench.manifest"] = settings.manifest
    for name, file in files.items():
        try:
            found[name] = sha256_file(file)
        except OSError:
            found[name] = "unreadable"
    return found


def require_current(layout: WorkloadLayout, settings: BenchConfig) -> None:
    """The bench outputs later stages read were computed from ``settings`` and the files it
    names as they are now; else the error naming the stale output and what rewrites it."""
    current = bench_inputs(settings)
    # The analysis first: it is computed from every input, the load points from the files.
    for result in (results.BENCH, results.LOAD_POINTS):
        try:
            result.check_inputs(layout, current, "bench.results and the bench section name")
        except StageOutputMissingError:
            return  # never written: the readers say so, as before


def write_results(
    result: BenchReadResult, layout: WorkloadLayout, inputs: dict[str, str] | None = None
) -> dict[str, Path]:
    open_stage_output(layout)
    paths = layout.bench
    write_parquet_atomic(result.load_points, paths.load_points)
    if result.per_request is not None:
        write_parquet_atomic(result.per_request, paths.per_request)
    else:
        paths.per_request.unlink(missing_ok=True)
    write_json_atomic(paths.read_notes, {"notes": result.notes})
    written = {"load_points": paths.load_points, "read_notes": paths.read_notes}
    if result.per_request is not None:
        written["per_request"] = paths.per_request
    results.LOAD_POINTS.seal(layout, written.values(), inputs)
    return {"load_points": paths.load_points, "read_notes": paths.read_notes}


def read_written_results(layout: WorkloadLayout) -> BenchReadResult:
    paths = layout.bench
    results.LOAD_POINTS.require(layout)
    per_request = pl.read_parquet(paths.per_request) if paths.per_request.is_file() else None
    notes = read_json(paths.read_notes)["notes"]
    return BenchReadResult(pl.read_parquet(paths.load_points), per_request, notes)


# ----------------------------------------------------------------------------- 2. analysis


@dataclass(frozen=True)
class BenchInputs:
    results: BenchReadResult
    facts: WorkloadFacts | None
    facts_source: str
    as_of: dt.date | None


def workload_facts(
    layout: WorkloadLayout, label: str | None = None
) -> tuple[WorkloadFacts | None, str]:
    """The workload's facts and where they came from (or why there are none). ``label`` names
    the workload folder (default: ``workload <folder name>``); the files are named relative to
    it, so the written analysis does not depend on where the data folder lives."""
    where = label or f"workload {layout.root.name}"

    def relative(path: Path) -> str:
        return str(path.relative_to(layout.root))

    try:
        facts = shape_stage.read_result(layout).facts
    except InputFormatError as exc:
        return None, f"{exc}: production checks unknown, no fleet sizing"
    source = f"{where}: {relative(layout.shape.summary)}"
    try:
        ratios = prefix_stage.read_result(layout).shared_prefix_ratio()
    except InputFormatError:
        return facts, f"{source} (no `enginefit prefix` output: prefix sharing unknown)"
    return (
        dataclasses.replace(facts, shared_prefix_ratio=ratios),
        f"{source} + {relative(layout.prefix.summary)}",
    )


def read_inputs(layout: WorkloadLayout, as_of: dt.date | None) -> BenchInputs:
    """The load points written by step 1 and the workload's facts, for the given report date
    (None: not given; the decision measures the benchmark's age from its own date, and no
    run's date is ever measured from the traffic's)."""
    facts, source = workload_facts(layout)
    return BenchInputs(read_written_results(layout), facts, source, as_of)


def run(inputs: BenchInputs, settings: BenchConfig) -> BenchResult:
    results = inputs.results
    if inputs.as_of is not None:
        refuse_runs_after(results.load_points, inputs.as_of, "the report date")
    else:
        refuse_runs_after(results.load_points, dates.today(), "today")
    analysis = analyse_bench(
        results.load_points,
        settings,
        inputs.facts,
        as_of=inputs.as_of,
        notes=results.notes,
        per_request=results.per_request,
    )
    return dataclasses.replace(
        analysis,
        facts_source=inputs.facts_source,
        prices_source=settings.prices.describe(),
    )


def write(
    analysis: BenchResult, layout: WorkloadLayout, inputs: dict[str, str] | None = None
) -> dict[str, Path]:
    """The analysis tables, its JSON document, the findings and the figures, atomically;
    ``inputs``: what they were computed from (:func:`bench_inputs`), sealed with them."""
    open_stage_output(layout)
    paths = layout.bench
    write_parquet_atomic(analysis.evaluated, paths.points)
    write_parquet_atomic(analysis.capacity, paths.capacity)
    write_parquet_atomic(analysis.fleet, paths.fleet)
    write_parquet_atomic(analysis.findings, paths.findings)
    write_json_atomic(paths.analysis, analysis_payload(analysis))
    write_json_atomic(
        paths.findings_json,
        {
            "as_of": analysis.as_of.isoformat() if analysis.as_of else None,
            "comparable": analysis.comparable,
            "differences": analysis.differences,
            "findings": analysis.findings.to_dicts(),
        },
    )
    written = {
        name: getattr(paths, name)
        for name in ("points", "capacity", "fleet", "findings", "analysis", "findings_json")
    }
    for name, svg in figures(analysis).items():
        write_bytes_atomic(getattr(paths, name), svg)
        written[name] = getattr(paths, name)
    results.BENCH.seal(layout, written.values(), inputs)
    return written


def read_analysis(layout: WorkloadLayout) -> BenchResult:
    """The analysis written by :func:`write`, read back with the settings it was made with
    (what later stages read)."""
    paths = layout.bench
    analysis = results.BENCH.require(layout)
    payload = read_json(analysis)
    return BenchResult(
        settings=AnalysisBasis.from_json(payload, str(analysis)),
        as_of=dt.date.fromisoformat(payload["as_of"]) if payload["as_of"] else None,
        evaluated=pl.read_parquet(paths.points),
        capacity=pl.read_parquet(paths.capacity),
        fleet=pl.read_parquet(paths.fleet),
        findings=pl.read_parquet(paths.findings),
        rates=payload["rates_rps"],
        comparable=payload["comparable"],
        differences=payload["differences"],
        notes=payload["notes"],
        facts_source=payload.get("workload_facts", "not recorded"),
        prices_source=payload.get("prices_source", "not recorded"),
    )


# ------------------------------------------------------------------- concurrency per engine


@dataclass(frozen=True)
class ConcurrencyByEngine:
    fits: pl.DataFrame
    table: pl.DataFrame
    notes: list[str]
    # what the days' sweeps cost (None: the table was swept whole); said, never written
    days: str | None = None


def run_concurrency(
    layout: WorkloadLayout, analysis: BenchResult, config_model: LatencyModel
) -> ConcurrencyByEngine:
    """The trace's concurrency under the configured latency model and under one fitted from
    each candidate's load point at its SLO capacity (:mod:`pipeline.bench.latency_fit`)."""

    fits = fit_latency_models(analysis.evaluated, analysis.capacity)
    notes: list[str] = []
    if NO_RESULTS in analysis.notes:
        notes.append(f"{NO_RESULTS}: only the configured latency model's figure")
    elif fits.is_empty():
        notes.append("no benchmark candidates: only the configured latency model's figure")
    elif not fits.get_column("fitted").any():
        notes.append(
            "no candidate has an SLO capacity with the needed percentiles: only the configured "
            "latency model's figure (reasons per candidate below)"
        )
    try:
        requests: pl.LazyFrame | None = read_requests(layout)
    except InputFormatError as exc:
        requests = None
        notes.append(f"no canonical request table ({exc}): no concurrency computed")
    if requests is None:
        return ConcurrencyByEngine(fits, pl.DataFrame(schema=CONCURRENCY_SCHEMA), notes)
    # a quarter of days is swept day by day under each model, each day's sweep kept
    sweeps = shape_stage.ModelSweeps.of(layout, requests, CONCURRENCY_POINTS)
    table = estimate_concurrency(requests, fits, config_model, sweep=sweeps)
    return ConcurrencyByEngine(fits, table, notes, sweeps.settle())


def write_concurrency(result: ConcurrencyByEngine, layout: WorkloadLayout) -> dict[str, Path]:
    open_stage_output(layout)

    paths = layout.bench
    write_parquet_atomic(result.table, paths.concurrency)
    payload: dict[str, Any] = concurrency_payload(result.fits, result.table, result.notes)
    write_json_atomic(paths.concurrency_json, payload)
    written = {"concurrency": paths.concurrency, "concurrency_json": paths.concurrency_json}
    results.LATENCY_FITS.seal(layout, written.values())
    return written


def read_latency_fits(layout: WorkloadLayout) -> pl.DataFrame:
    """The latency models fitted per candidate (written by :func:`write_concurrency`)."""
    fits = read_json(results.LATENCY_FITS.require(layout))["fits"]
    return pl.DataFrame(fits, infer_schema_length=None) if fits else pl.DataFrame()


def run_configured(
    layout: WorkloadLayout, settings: BenchConfig, config_model: LatencyModel
) -> tuple[BenchResult, str | None]:
    """The configured workload's whole bench stage, written: results, analysis, concurrency;
    and what the concurrency's days' sweeps cost (:attr:`ConcurrencyByEngine.days`)."""
    inputs = bench_inputs(settings)
    write_results(read_results(settings), layout, inputs)
    analysis = run(read_inputs(layout, settings.as_of), settings)
    write(analysis, layout, inputs)
    concurrency = run_concurrency(layout, analysis, config_model)
    write_concurrency(concurrency, layout)
    return analysis, concurrency.days
