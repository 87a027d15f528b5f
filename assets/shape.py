"""The workload-shape stage as an asset with its checks (logic: pipeline.shape.stage)."""

from __future__ import annotations

import dagster as dg

from assets.inputs import step_deps
from assets.metadata import CHECK_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.shape import checks, stage
from pipeline.shape.present import summary_tables


@dg.asset(
    key=stage.STEP.asset,
    deps=step_deps(stage.STEP),
    group_name="shape",
    kinds={"polars", "svg"},
)
def workload_shape(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Arrival pattern, token lengths, concurrency (exact or estimated, and labelled), traffic
    mix, and the findings that place the workload on the axes of docs/decision-rules.md."""
    config = store.config()
    layout = config.layout()
    inputs = stage.read_inputs(layout)
    result = stage.run(inputs, config.shape)
    paths = stage.write(result, layout)
    metrics = result.metrics
    return dg.MaterializeResult(
        metadata={
            "requests": metrics.requests,
            "peak_concurrency": metrics.concurrency.peak,
            "peak_concurrency_estimated": metrics.concurrency.estimated,
            "concurrency_label": metrics.concurrency.label,
            "timestamps_quantised": metrics.arrivals.quantisation.quantised,
            **{
                f"{name}_table": md(text) for name, text in summary_tables(result.to_json()).items()
            },
            "day_parts": md(
                stage.days_note(inputs) or "none: measured as one table, not day by day"
            ),
            **path_entries(paths),
        }
    )


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=workload_shape,
    description="Estimated concurrency carries its model.",
)
def estimated_concurrency_labelled(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.estimates_labelled(stage.read_result(store.layout()).metrics))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=workload_shape,
    description="Statistics the timestamps cannot support say why.",
)
def unsupported_statistics_explained(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.unsupported_have_reasons(stage.read_result(store.layout()).metrics))


ASSETS = [workload_shape]
CHECKS = [estimated_concurrency_labelled, unsupported_statistics_explained]
