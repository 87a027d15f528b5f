"""The one Definitions object: every asset, check, resource and job, listed explicitly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets import bench as bench_stage
from assets import decision as decision_stage
from assets import ingest
from assets import prefix as prefix_stage
from assets import report as report_stage
from assets import shape as shape_stage
from assets import sim as sim_stage
from assets.progress import PROGRESS_LOGGER, progress_logger
from assets.resources import EnginefitStore

# One module per stage; each exposes ASSETS and CHECKS lists. Keep one line per stage.
_STAGES = [
    ingest,
    prefix_stage,
    shape_stage,
    bench_stage,
    sim_stage,
    decision_stage,
    report_stage,
]

all_assets = [a for stage in _STAGES for a in stage.ASSETS]
all_checks = [c for stage in _STAGES for c in stage.CHECKS]

full_report_job = dg.define_asset_job("full_report", selection=dg.AssetSelection.all())

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources={"store": EnginefitStore()},
    jobs=[full_report_job],
    schedules=report_stage.schedules(full_report_job),
    sensors=report_stage.sensors(full_report_job),
    # Dagster's console logger stays the default; `enginefit report` asks for the progress one.
    loggers={"console": dg.colored_console_logger, PROGRESS_LOGGER: progress_logger},
)


@dataclass(frozen=True)
class GraphRun:
    """What a full run produced: (asset, label, path) per output file, and (step, message) per
    step that raised."""

    outputs: list[tuple[str, str, str]]
    failures: list[tuple[str, str]]
    checks_passed: int
    checks_failed: list[tuple[str, str, str]]  # (asset/check, severity, problems)
    success: bool
    unchanged_report: bool = False  # the report matched its latest version: nothing published


def run_full_graph(config_path: Path, instance: dg.DagsterInstance) -> GraphRun:
    """Materialise every asset and check in-process."""
    store = EnginefitStore(config_path=str(config_path))
    result = defs.resolve_job_def(full_report_job.name).execute_in_process(
        instance=instance,
        resources={"store": store},
        # Dagster's step logs (tracebacks included) would bury the summary: one progress line
        # per step instead, failures as one line each below; the run history keeps every event.
        run_config={"loggers": {PROGRESS_LOGGER: {}}},
        raise_on_error=False,
    )
    outputs = []
    unchanged_report = False
    storage = Path(instance.root_directory).resolve()
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        new_version = materialization.metadata.get("new_version")
        if isinstance(new_version, dg.BoolMetadataValue) and new_version.value is False:
            unchanged_report = True
        for label, value in materialization.metadata.items():
            # The IO manager's own pickles under DAGSTER_HOME are not outputs a reader wants.
            if isinstance(value, dg.PathMetadataValue) and not Path(value.path).is_relative_to(
                storage
            ):
                outputs.append((materialization.asset_key.to_user_string(), label, value.path))
    failures = []
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        # The user's error is the cause Dagster wrapped (e.g. a ConfigError naming the file).
        cause = error.cause if error is not None and error.cause is not None else error
        message = "unknown error"
        if cause is not None:
            text = cause.message.strip().splitlines()[-1]
            qualified_name, _, rest = text.partition(": ")
            message = rest if qualified_name.endswith(str(cause.cls_name)) else text
        failures.append((event.step_key or "?", message))
    passed = 0
    failed = []
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.passed:
            passed += 1
            continue
        problems = evaluation.metadata.get("problems")
        failed.append(
            (
                f"{evaluation.asset_key.to_user_string()}/{evaluation.check_name}",
                evaluation.severity.value,
                str(problems.value).replace("\n", " ") if problems is not None else "",
            )
        )
    return GraphRun(outputs, failures, passed, failed, result.success, unchanged_report)
