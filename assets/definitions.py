"""The one Definitions object: every asset, check, resource and job, listed explicitly."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from assets import bench as bench_stage
from assets import ingest
from assets import prefix as prefix_stage
from assets import shape as shape_stage
from assets import sim as sim_stage
from assets.resources import EnginefitStore

# One module per stage; each exposes ASSETS and CHECKS lists. Keep one line per stage.
_STAGES = [
    ingest,
    prefix_stage,
    shape_stage,
    bench_stage,
    sim_stage,
]

all_assets = [a for stage in _STAGES for a in stage.ASSETS]
all_checks = [c for stage in _STAGES for c in stage.CHECKS]

full_report_job = dg.define_asset_job("full_report", selection=dg.AssetSelection.all())

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources={"store": EnginefitStore()},
    jobs=[full_report_job],
)


def run_full_graph(
    config_path: Path, instance: dg.DagsterInstance
) -> tuple[list[tuple[str, str, str]], bool]:
    """Materialise every asset and check in-process; return (asset, label, path) of each output."""
    store = EnginefitStore(config_path=str(config_path))
    result = dg.materialize(
        [*all_assets, *all_checks],
        instance=instance,
        resources={"store": store},
        # Step-level DEBUG lines would bury the summary; the UI still shows every event.
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        raise_on_error=False,
    )
    outputs = []
    storage = Path(instance.root_directory).resolve()
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        for label, value in materialization.metadata.items():
            # The IO manager's own pickles under DAGSTER_HOME are not outputs a reader wants.
            if isinstance(value, dg.PathMetadataValue) and not Path(value.path).is_relative_to(
                storage
            ):
                outputs.append((materialization.asset_key.to_user_string(), label, value.path))
    return outputs, result.success
