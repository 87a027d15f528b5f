"""The bench stage as assets (logic: :mod:`pipeline.bench.stage`).

``bench_load_points`` normalises the configured result files; ``bench_analysis`` joins them with
the workload's facts (SLO status, capacity, cost, fleet, validity findings, figures);
``concurrency_by_engine`` re-estimates the trace's concurrency with latency models fitted at each
candidate's capacity. With no ``bench.results`` configured every asset still materialises, with
metadata saying so, so ``make report`` works on a configuration without benchmarks.

The age check's date is the report date (:mod:`pipeline.dates`): ``bench.as_of`` when
configured, else the ``ENGINEFIT_RUN_DATE`` environment variable; without either the benchmark's
age is measured by the decision, from the day it is made.
"""

import dagster as dg
import polars as pl

from assets.inputs import BENCH_RESULT_FILES, WORKLOAD_FOLDER, step_deps
from assets.metadata import CHECK_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.bench import stage
from pipeline.bench.checks import findings_well_formed, no_silent_pass
from pipeline.bench.config import configured_as_of
from pipeline.bench.latency_fit import METHOD, summary_markdown
from pipeline.bench.present import POINT_VIEW, capacity_table, findings_table, fleet_table
from pipeline.costing import COST_FORMULA, FLEET_FORMULA
from pipeline.present.tables import bullet_list


@dg.asset(
    key=stage.RESULTS_STEP.asset,
    # The result files and the workload folder are read from outside the graph.
    deps=step_deps(stage.RESULTS_STEP, BENCH_RESULT_FILES, WORKLOAD_FOLDER),
    group_name="bench",
    kinds={"polars", "parquet"},
)
def bench_load_points(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Configured benchmark result files normalised to one row per load point (engine, GPU and
    date from the sidecar manifests), with the per-request rows where a file has them."""
    config = store.config()
    settings = config.bench
    result = stage.read_results(settings)
    paths = stage.write_results(result, config.layout(), stage.bench_inputs(settings))
    points = result.load_points
    return dg.MaterializeResult(
        metadata={
            "status": f"{points.height} load points from {len(settings.results)} configured path(s)"
            if settings.results
            else stage.NO_RESULTS,
            "dagster/row_count": points.height,
            "per_request_rows": 0 if result.per_request is None else result.per_request.height,
            "notes": md(bullet_list(result.notes)),
            "load_points": md(points.select([c for c in POINT_VIEW if c in points.columns])),
            **path_entries(paths),
        }
    )


@dg.asset(
    key=stage.ANALYSIS_STEP.asset,
    deps=step_deps(stage.ANALYSIS_STEP),
    group_name="bench",
    kinds={"polars", "svg"},
)
def bench_analysis(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Per load point: SLO status (overloaded points fail; percentiles need enough requests).
    Per candidate: the highest passing load below the first failure, cost per 1M tokens there,
    the fleet for the workload's mean and peak rate, and whether each benchmark is about this
    traffic (validity findings, each with its numbers). Plots of latency vs load and cost."""
    config = store.config()
    settings = config.bench
    layout = config.layout()
    as_of, as_of_source = configured_as_of(settings)
    inputs = stage.read_inputs(layout, as_of)
    analysis = stage.run(inputs, settings)
    paths = stage.write(analysis, layout, stage.bench_inputs(settings))
    findings = analysis.findings
    return dg.MaterializeResult(
        metadata={
            "as_of": f"{inputs.as_of.isoformat() if inputs.as_of else 'the decision date'} "
            f"({as_of_source})",
            "workload_facts": inputs.facts_source,
            "prices": analysis.prices_source,
            "slo": settings.slo.describe(),
            "dagster/row_count": analysis.capacity.height,
            "comparable": analysis.comparable,
            "cost_formula": COST_FORMULA,
            "fleet_formula": FLEET_FORMULA,
            "capacity": md(capacity_table(analysis)),
            "fleet": md(fleet_table(analysis)),
            "findings": md(findings_table(analysis)),
            **{
                status: findings.filter(pl.col("status") == status).height
                for status in ("flag", "unknown", "ok")
            },
            "notes": md(bullet_list(analysis.notes)),
            **path_entries(paths),
        }
    )


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=bench_analysis,
    description="No load point passes the SLO with a limited percentile missing or broken, "
    "too few requests behind a percentile, or an open-loop server not shown to keep up.",
)
def bench_no_silent_pass(store: EnginefitStore) -> dg.AssetCheckResult:
    config = store.config()
    evaluated = pl.read_parquet(config.layout().bench.points)
    return check_result(no_silent_pass(evaluated, config.bench))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=bench_analysis,
    description="Every validity finding has a status, a message and a known check name.",
)
def bench_findings_well_formed(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(findings_well_formed(pl.read_parquet(store.layout().bench.findings)))


@dg.asset(
    key=stage.CONCURRENCY_STEP.asset,
    deps=step_deps(stage.CONCURRENCY_STEP),
    group_name="bench",
    kinds={"polars", "parquet"},
)
def concurrency_by_engine(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """The trace's peak and mean concurrency re-estimated with a latency model per candidate,
    fitted from its load point at the SLO capacity, beside the configured model's figure; every
    figure is labelled estimated with its parameters."""

    config = store.config()
    layout = config.layout()
    analysis = stage.read_analysis(layout)
    result = stage.run_concurrency(layout, analysis, config.shape.latency)
    paths = stage.write_concurrency(result, layout)
    table = result.table
    fitted = table.filter(pl.col("peak_concurrency").is_not_null() & (pl.col("model") != "config"))
    metadata: dict[str, object] = {
        "status": "; ".join(result.notes) or f"{fitted.height} fitted model(s)",
        "dagster/row_count": table.height,
        "method": METHOD,
        "fitted_models": fitted.height,
        "concurrency": md(summary_markdown(table)),
        **({"days": result.days} if result.days else {}),
        **path_entries(paths),
    }
    configured = table.filter(pl.col("model") == "config")
    if configured.height:
        metadata["config_peak_concurrency"] = int(configured.item(0, "peak_concurrency"))
    return dg.MaterializeResult(metadata=metadata)  # type: ignore[arg-type]


ASSETS = [bench_load_points, bench_analysis, concurrency_by_engine]
CHECKS = [bench_no_silent_pass, bench_findings_well_formed]
