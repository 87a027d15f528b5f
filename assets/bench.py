"""Dagster layer of the benchmark join: load points, SLO capacity and cost, validity findings.

Logic lives in :mod:`pipeline.bench`; these assets read the ``bench`` config section, call it,
write files under ``<workload dir>/bench/`` and report metadata. With no ``bench.results``
configured every asset still materialises, with metadata saying so, so ``make report`` works on
a configuration without benchmarks.

The age check's date is ``bench.as_of`` when configured, else the ``ENGINEFIT_RUN_DATE``
environment variable, else the date (UTC) this Dagster run was created.
"""

import datetime as dt
import os
from typing import Any

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets.metadata import md
from assets.resources import EnginefitStore
from pipeline.bench.charts import cost_svg, latency_vs_load_svg
from pipeline.bench.cost import COST_FORMULA, FLEET_FORMULA
from pipeline.bench.schema import empty_load_points
from pipeline.bench.slo import BenchSettings, check_no_silent_pass, parse_as_of
from pipeline.bench.stage import workload_facts
from pipeline.bench.validity import (
    BenchAnalysis,
    analyse_bench,
    analysis_payload,
    check_findings_well_formed,
)
from pipeline.facts import WorkloadFacts
from pipeline.store import write_bytes_atomic, write_json_atomic, write_parquet_atomic

RUN_DATE_ENV = "ENGINEFIT_RUN_DATE"
NO_RESULTS = "no bench results configured (set bench.results in the configuration)"

_CAPACITY_VIEW = [
    "candidate",
    "sweep",
    "pattern",
    "capacity_status",
    "capacity_rps",
    "interpolated",
    "output_throughput_tps",
    "gpu_hour_usd",
    "cost_per_1m_output_usd",
    "cost_per_1m_total_usd",
    "rank_pool",
    "cost_rank",
    "noise_note",
    "note",
]


def _settings(store: EnginefitStore) -> BenchSettings:
    return store.config().bench


def _facts(store: EnginefitStore) -> tuple[WorkloadFacts | None, str]:
    return workload_facts(store.layout())


def _as_of(context: AssetExecutionContext, settings: BenchSettings) -> tuple[dt.date, str]:
    if settings.as_of is not None:
        return settings.as_of, "bench.as_of"
    if os.environ.get(RUN_DATE_ENV):
        return parse_as_of(os.environ[RUN_DATE_ENV], RUN_DATE_ENV), RUN_DATE_ENV
    record = context.instance.get_run_record_by_id(context.run.run_id)
    created = record.create_timestamp if record is not None else None
    if created is None:  # pragma: no cover - Dagster always records a run
        raise RuntimeError("Dagster run has no creation time and bench.as_of is not set")
    return created.astimezone(dt.UTC).date(), "run date"


@dg.asset(
    key="bench_load_points",
    group_name="bench",
    kinds={"polars", "parquet"},
    description="Configured benchmark result files normalised to one row per load point.",
)
def bench_load_points(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    from pipeline.bench import read_bench_files

    settings = _settings(store)
    out = store.layout().bench
    if not settings.results:
        write_parquet_atomic(empty_load_points(), out.load_points)
        out.per_request.unlink(missing_ok=True)
        write_json_atomic(out.read_notes, {"notes": [NO_RESULTS], "results": []})
        return dg.MaterializeResult(
            metadata={
                "status": NO_RESULTS,
                "dagster/row_count": 0,
                "load_points_path": dg.MetadataValue.path(str(out.load_points)),
            }
        )
    result = read_bench_files(list(settings.results), manifest=settings.manifest)
    points = result.load_points
    write_parquet_atomic(points, out.load_points)
    if result.per_request is not None:
        write_parquet_atomic(result.per_request, out.per_request)
    else:
        out.per_request.unlink(missing_ok=True)
    write_json_atomic(
        out.read_notes,
        {"notes": result.notes, "results": [str(p) for p in settings.results]},
    )
    view = [
        c
        for c in (
            "point_id",
            "engine",
            "gpu_type",
            "gpu_count",
            "load_mode",
            "offered_rate_rps",
            "achieved_rate_rps",
            "ttft_p95_ms",
            "itl_p99_ms",
            "output_tokens_per_s",
        )
        if c in points.columns
    ]
    return dg.MaterializeResult(
        metadata={
            "status": f"{points.height} load points from {len(settings.results)} configured path(s)",
            "dagster/row_count": points.height,
            "per_request_rows": 0 if result.per_request is None else result.per_request.height,
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in result.notes) or "none"),
            "load_points": md(points.select(view)),
            "load_points_path": dg.MetadataValue.path(str(out.load_points)),
        }
    )


def _analyse(
    context: AssetExecutionContext, store: EnginefitStore
) -> tuple[BenchAnalysis, dict[str, Any]]:
    settings = _settings(store)
    paths = store.layout().bench
    points = pl.read_parquet(paths.load_points)
    per_request = pl.read_parquet(paths.per_request) if paths.per_request.is_file() else None
    facts, facts_source = _facts(store)
    as_of, as_of_source = _as_of(context, settings)
    analysis = analyse_bench(points, settings, facts, as_of=as_of, per_request=per_request)
    info: dict[str, Any] = {
        "as_of": f"{as_of.isoformat()} ({as_of_source})",
        "workload_facts": facts_source,
        "slo": settings.slo.describe(),
    }
    if not settings.results:
        info["status"] = NO_RESULTS
    return analysis, info


@dg.asset(
    key="bench_slo_capacity",
    deps=[bench_load_points, "workload_shape", "prefix_sharing"],
    group_name="bench",
    kinds={"polars", "parquet"},
    description=(
        "Per candidate: SLO status of every load point, the highest passing offered rate below "
        "the first failure, cost per 1M output/total tokens there, and the fleet for the "
        "workload's mean and peak rate; plots of latency vs load and cost at the SLO."
    ),
)
def bench_slo_capacity(
    context: AssetExecutionContext, store: EnginefitStore
) -> dg.MaterializeResult:  # type: ignore[type-arg]
    analysis, info = _analyse(context, store)
    out = store.layout().bench
    write_parquet_atomic(analysis.evaluated, out.points)
    write_parquet_atomic(analysis.capacity, out.capacity)
    write_parquet_atomic(analysis.fleet, out.fleet)
    write_json_atomic(out.analysis, analysis_payload(analysis))
    latency_svg = out.latency_svg
    cost_chart = out.cost_svg
    write_bytes_atomic(latency_svg, latency_vs_load_svg(analysis.evaluated, analysis.settings.slo))
    write_bytes_atomic(cost_chart, cost_svg(analysis.capacity, comparable=analysis.comparable))
    capacity_view = analysis.capacity.select(
        [c for c in _CAPACITY_VIEW if c in analysis.capacity.columns]
    )
    return dg.MaterializeResult(
        metadata={
            **info,
            "dagster/row_count": analysis.capacity.height,
            "comparable": analysis.comparable,
            "cost_formula": COST_FORMULA,
            "fleet_formula": FLEET_FORMULA,
            "capacity": md(capacity_view),
            "fleet": md(analysis.fleet),
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in analysis.notes) or "none"),
            "latency_vs_load_svg": dg.MetadataValue.path(str(latency_svg)),
            "cost_per_1m_svg": dg.MetadataValue.path(str(cost_chart)),
            "analysis_json": dg.MetadataValue.path(str(out.analysis)),
        }
    )


@dg.asset(
    key="bench_validity",
    deps=[bench_load_points, "workload_shape", "prefix_sharing"],
    group_name="bench",
    kinds={"polars", "parquet"},
    description=(
        "Is each benchmark about our traffic? Fixed lengths vs production tail, length and "
        "prefix-structure mismatch, swept range vs production peak, age, closed loop, and "
        "whether candidates are comparable at all; every flag names its numbers."
    ),
)
def bench_validity(context: AssetExecutionContext, store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    analysis, info = _analyse(context, store)
    out = store.layout().bench
    findings = analysis.findings
    write_parquet_atomic(findings, out.findings)
    write_json_atomic(
        out.findings_json,
        {
            "as_of": analysis.as_of.isoformat() if analysis.as_of else None,
            "comparable": analysis.comparable,
            "differences": analysis.differences,
            "findings": findings.to_dicts(),
        },
    )
    counts = {
        status: findings.filter(pl.col("status") == status).height
        for status in ("flag", "unknown", "ok")
    }
    return dg.MaterializeResult(
        metadata={
            **info,
            "dagster/row_count": findings.height,
            "flags": counts["flag"],
            "unknown": counts["unknown"],
            "ok": counts["ok"],
            "comparable": analysis.comparable,
            "findings": md(
                findings.filter(pl.col("status") != "ok").select(
                    "candidate", "check", "status", "message"
                )
            ),
            "findings_path": dg.MetadataValue.path(str(out.findings)),
        }
    )


@dg.asset_check(
    asset=bench_slo_capacity,
    description="No load point passes the SLO with a limited percentile missing or broken.",
)
def bench_no_silent_pass(store: EnginefitStore) -> dg.AssetCheckResult:
    settings = _settings(store)
    evaluated = pl.read_parquet(store.layout().bench.points)
    passed, detail = check_no_silent_pass(evaluated, settings.slo, settings.min_tail_requests)
    return dg.AssetCheckResult(passed=passed, metadata={"detail": detail})


@dg.asset_check(
    asset=bench_validity,
    description="Every validity finding has a status, a message and a known check name.",
)
def bench_findings_well_formed(store: EnginefitStore) -> dg.AssetCheckResult:
    findings = pl.read_parquet(store.layout().bench.findings)
    passed, detail = check_findings_well_formed(findings)
    return dg.AssetCheckResult(passed=passed, metadata={"detail": detail})


@dg.asset(
    key="concurrency_by_engine",
    deps=[bench_slo_capacity, "workload"],
    group_name="bench",
    kinds={"polars", "parquet"},
    description=(
        "The trace's peak and mean concurrency re-estimated with a latency model per candidate, "
        "fitted from its load point at the SLO capacity, beside the configured model's figure; "
        "every figure is labelled estimated with its parameters."
    ),
)
def concurrency_by_engine(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    from pipeline.bench.latency_fit import (
        CONCURRENCY_SCHEMA,
        METHOD,
        concurrency_payload,
        estimate_concurrency,
        fit_latency_models,
        summary_markdown,
    )
    from pipeline.errors import InputFormatError
    from pipeline.ingest.stage import read_requests

    config = store.config()
    settings = config.bench
    out = config.layout().bench
    fits = fit_latency_models(pl.read_parquet(out.points), pl.read_parquet(out.capacity))
    notes: list[str] = []
    if not settings.results:
        notes.append(f"{NO_RESULTS}: only the configured latency model's figure")
    elif fits.is_empty():
        notes.append("no benchmark candidates: only the configured latency model's figure")
    elif not fits.get_column("fitted").any():
        notes.append(
            "no candidate has an SLO capacity with the needed percentiles: only the configured "
            "latency model's figure (reasons per candidate below)"
        )
    try:
        requests = read_requests(config.layout())
    except InputFormatError as exc:
        requests = None
        notes.append(f"no canonical request table ({exc}): no concurrency computed")
    table = (
        estimate_concurrency(requests, fits, config.shape.latency, max_points=10)
        if requests is not None
        else pl.DataFrame(schema=CONCURRENCY_SCHEMA)
    )
    parquet_path = out.concurrency
    json_path = out.concurrency_json
    write_parquet_atomic(table, parquet_path)
    write_json_atomic(json_path, concurrency_payload(fits, table, notes))
    config_rows = table.filter(pl.col("model") == "config")
    bench_rows = table.filter(
        pl.col("peak_concurrency").is_not_null() & (pl.col("model") != "config")
    )
    metadata: dict[str, Any] = {
        "status": "; ".join(notes) or f"{bench_rows.height} fitted model(s)",
        "dagster/row_count": table.height,
        "method": METHOD,
        "fitted_models": bench_rows.height,
        "concurrency": dg.MetadataValue.md(summary_markdown(table)),
        "concurrency_by_engine_path": dg.MetadataValue.path(str(parquet_path)),
        "concurrency_by_engine_json": dg.MetadataValue.path(str(json_path)),
    }
    if config_rows.height:
        metadata["config_peak_concurrency"] = int(config_rows.item(0, "peak_concurrency"))
    return dg.MaterializeResult(metadata=metadata)


ASSETS = [bench_load_points, bench_slo_capacity, bench_validity, concurrency_by_engine]
CHECKS = [bench_no_silent_pass, bench_findings_well_formed]
