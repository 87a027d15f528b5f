"""The capacity stage as an asset with its checks (logic: :mod:`pipeline.capacity.stage`)."""

from __future__ import annotations

import dagster as dg

from assets.inputs import step_deps
from assets.metadata import CHECK_PRIORITY, STAGE_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.capacity import checks, stage
from pipeline.capacity.present import candidates_table, transfer_sentence
from pipeline.commands.capacity import configured_inputs
from pipeline.present.tables import bullet_list


@dg.asset(
    key=stage.STEP.asset,
    deps=step_deps(stage.STEP),
    group_name="capacity",
    kinds={"numba", "parquet"},
    op_tags=STAGE_PRIORITY,
)
def workload_capacity(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Per benchmarked deployment: a serving model fitted from its kept-up load points, carried
    to this workload's own prompt/output lengths and prefix-cache hits: capacity at the SLO with
    its band, replicas at the peak, monthly cost and $/1M tokens of this workload."""
    config = store.config()
    layout = config.layout()
    inputs = configured_inputs(config)
    result = stage.run(inputs, config.capacity)
    paths = stage.write(result, layout)
    return dg.MaterializeResult(
        metadata={
            "slo": result.slo.describe(),
            "dagster/row_count": len(result.candidates),
            "transfer": md(bullet_list([transfer_sentence(c) for c in result.candidates])),
            "candidates": md(candidates_table(result)),
            "sources": md(bullet_list([f"{k}: {v}" for k, v in sorted(result.sources.items())])),
            "notes": md(bullet_list(result.notes)),
            **(
                {"resumed": "\n".join(resumed)} if (resumed := stage.settle_replays(inputs)) else {}
            ),
            **path_entries(paths),
        }
    )


def _check(name: str, description: str) -> dg.AssetChecksDefinition:
    predicate = getattr(checks, name)

    @dg.asset_check(
        name=name, op_tags=CHECK_PRIORITY, asset=workload_capacity, description=description
    )
    def _run(store: EnginefitStore) -> dg.AssetCheckResult:
        return check_result(predicate(stage.read_result(store.layout())))

    return _run


CHECKS = [
    _check("capacity_within_band", "Every known capacity lies inside its ordered band."),
    _check(
        "no_zero_stands_for_unknown",
        "A capacity, band or price is a positive figure or an unknown with its reason.",
    ),
    _check(
        "fit_errors_reported",
        "Every fitted model reports its error on each point it was fitted on, within bounds.",
    ),
    _check(
        "far_transfers_are_provisional",
        "A transfer far outside the measured mix carries a provisional reason.",
    ),
]
ASSETS = [workload_capacity]
