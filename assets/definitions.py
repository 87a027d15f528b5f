"""The one Definitions object: every asset, check, resource and job, listed explicitly."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import dagster as dg

from assets import bench as bench_stage
from assets import capacity as capacity_stage
from assets import decision as decision_stage
from assets import ingest, inputs, observed_inputs
from assets import prefix as prefix_stage
from assets import report as report_stage
from assets import shape as shape_stage
from assets import sim as sim_stage
from assets import whatif as whatif_stage
from assets.days import configured_quarter, day_assets, quarter_partitions, shape_day_asset
from assets.executors import (
    EXECUTOR_ENV,
    Executor,
    configured_executor,
    executor_config,
    stop_fork_server,
)
from assets.progress import QUIET_LOGGERS, watch_steps
from assets.resources import EnginefitStore
from assets.staleness import record_data_versions, stale_or_missing
from pipeline.config import load_config
from pipeline.errors import ConfigError, EnginefitError, StageOutputUnreadableError
from pipeline.layout import WorkloadLayout

# One module per stage; each exposes ASSETS and CHECKS lists. Keep one line per stage.
_STAGES = [
    observed_inputs,
    ingest,
    prefix_stage,
    shape_stage,
    bench_stage,
    sim_stage,
    capacity_stage,
    decision_stage,
    whatif_stage,
    report_stage,
]

all_assets = [a for stage in _STAGES for a in stage.ASSETS]
all_checks = [c for stage in _STAGES for c in stage.CHECKS]

FULL_REPORT = "full_report"


def build_definitions(
    executor: dg.ExecutorDefinition | None = None, quarter: str | None = None
) -> dg.Definitions:
    """Every asset, check, resource, job, schedule and sensor. ``executor`` None keeps Dagster's
    default (multiprocess or in-process, chosen in the run config); ``quarter`` (YYYY-Qn) ingests
    by day: ``workload_day`` partitioned over its days, ``workload`` their union, and the
    ``ingest_days`` job and schedule (:mod:`assets.days`)."""
    assets = list(all_assets)
    # The outside inputs are observed in the same run, so it records what each stage read.
    selection: dg.AssetSelection = dg.AssetSelection.all() | dg.AssetSelection.assets(
        *inputs.INPUT_KEYS
    )
    jobs = []
    schedules = []
    if quarter is not None:
        partitions = quarter_partitions(quarter)
        workload_day, union = day_assets(partitions)
        shape_day = shape_day_asset(partitions)
        assets = [
            workload_day,
            union,
            shape_day,
            *(a for a in all_assets if a is not ingest.workload),
        ]
        selection = selection - dg.AssetSelection.assets(workload_day, shape_day)
        ingest_days = dg.define_asset_job("ingest_days", selection=[workload_day])
        jobs += [ingest_days, dg.define_asset_job("shape_days", selection=[shape_day])]
        schedules.append(
            dg.build_schedule_from_partitioned_job(
                ingest_days, name="ingest_days_schedule", hour_of_day=5
            )
        )
    full_report = dg.define_asset_job(FULL_REPORT, selection=selection)
    return dg.Definitions(
        assets=assets,
        asset_checks=all_checks,
        resources={"store": EnginefitStore()},
        jobs=[full_report, *jobs],
        schedules=[*report_stage.schedules(full_report), *schedules],
        sensors=report_stage.sensors(full_report),
        executor=executor,
    )


@cache
def definitions_for(quarter: str | None) -> dg.Definitions:
    """The definitions with daily partitions over ``quarter`` (None: none), built once."""
    return build_definitions(configured_executor(), quarter)


# Configuration, not code: ENGINEFIT_EXECUTOR names a cluster executor (assets/executors.py),
# workload.daily_quarter in the code location's enginefit.yaml ingests that quarter day by day
# (assets/days.py).
defs = definitions_for(configured_quarter())


def report_job_def(config_path: str) -> dg.JobDefinition:
    """The full-report job of the definitions ``config_path`` implies (with its daily
    partitions or without): what ``enginefit report --config FILE`` runs, and what each step's
    process rebuilds (the multiprocess executor's workers import this module and call this)."""
    return definitions_for(configured_quarter(config_path)).resolve_job_def(FULL_REPORT)


def report_run_config(
    config_path: Path, executor: Executor, max_concurrent: int | None = None
) -> dict[str, Any]:
    """The run config of ``enginefit report``: the configuration file, the executor, and quiet
    console logging (progress lines come from the event log, :mod:`assets.progress`)."""
    return {
        "resources": {"store": {"config": {"config_path": str(config_path)}}},
        "execution": {"config": executor_config(executor, max_concurrent)},
        "loggers": QUIET_LOGGERS,
    }


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
    # what the streamed replays of a quarter of days resumed, one line a replay (docs/resume.md)
    resumed: tuple[str, ...] = ()


def _error_line(error: Any) -> str:
    """The user's error a Dagster error wraps, as its one-line message."""
    cause = error.cause if error.cause is not None else error
    text = cause.message.strip().splitlines()[-1]
    qualified_name, _, rest = text.partition(": ")
    return str(rest if qualified_name.endswith(str(cause.cls_name)) else text)


def _run_failure(result: dg.ExecutionResult) -> str:
    """Why a run failed when no step did (a step's process that could not start or died)."""
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        if error is not None:
            return _error_line(error)
    failure = [e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE]
    return failure[0].message or "unknown error" if failure else "unknown error"


def run_full_graph(
    config_path: Path,
    instance: dg.DagsterInstance,
    *,
    executor: Executor | None = None,
    max_concurrent: int | None = None,
    progress: Callable[[str], None] | None = None,
    assets: Sequence[dg.AssetKey] | None = None,
) -> GraphRun:
    """Materialise every asset and check as one run of ``full_report`` on ``instance``.

    ``executor``: ``multiprocess`` (the default on a persistent instance: independent steps,
    e.g. the simulation scenarios, run side by side in processes of their own) or
    ``in_process``, the only one an ephemeral instance (tests) can run. ``progress`` receives a
    line per finished step while the run goes on (persistent instances only). Dagster's own
    step logs (tracebacks included) would bury the summary: failures come back as one line each
    in :attr:`GraphRun.failures`, and the run history keeps every event. ``assets``: only
    these (with their checks), as ``enginefit decide`` asks (:func:`materialise_stale`).
    """
    if defs.executor is not None:
        raise ConfigError(
            f"{EXECUTOR_ENV} names a cluster executor: `enginefit report` runs on this machine; "
            "launch the full_report job on the cluster instead (README, Scale)"
        )
    if executor is None:
        executor = "in_process" if instance.is_ephemeral else "multiprocess"
    tags = {"enginefit/invocation": uuid.uuid4().hex}
    try:
        with watch_steps(instance, tags, progress):
            result = dg.execute_job(
                dg.build_reconstructable_job(
                    __name__, report_job_def.__name__, reconstructable_args=(str(config_path),)
                ),
                instance=instance,
                run_config=report_run_config(config_path, executor, max_concurrent),
                tags=tags,
                raise_on_error=False,
                asset_selection=assets,
            )
    finally:
        if executor == "multiprocess":
            stop_fork_server()
    outputs = []
    unchanged_report = False
    resumed: list[str] = []
    storage = Path(instance.root_directory).resolve()
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        said = materialization.metadata.get("resumed")
        if isinstance(said, dg.TextMetadataValue) and said.value:
            resumed += said.value.splitlines()
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
        failures.append((event.step_key or "?", _error_line(error) if error else "unknown error"))
    if not result.success and not failures:
        failures.append(("run", _run_failure(result)))
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
    return GraphRun(
        outputs, failures, passed, failed, result.success, unchanged_report, tuple(resumed)
    )


def _raise_failure(run: GraphRun) -> None:
    if run.failures:
        raise EnginefitError(run.failures[0][1])


def _outputs_gone(event: dg.EventLogEntry | None) -> bool:
    """Whether a file an asset's latest materialisation (``event``) recorded as written is gone
    (a workload folder deleted by hand): Dagster's history says fresh, the folder says
    missing."""
    if event is None or event.asset_materialization is None:
        return False
    return any(
        isinstance(value, dg.PathMetadataValue) and not Path(value.path).exists()
        for value in event.asset_materialization.metadata.values()
    )


#: Each asset's step, by asset key: the result it writes and seals.
_STEP_BY_ASSET = {step.asset: step for step in inputs.STEPS}


def _outputs_damaged(layout: WorkloadLayout, key: dg.AssetKey) -> bool:
    """Whether ``key``'s outputs no longer match the seal its stage wrote (changed, cut short,
    or the seal gone): Dagster's history says fresh, the next reader would refuse them."""
    step = _STEP_BY_ASSET.get(key.to_user_string())
    if step is None or not step.writes.files:
        return False
    if not step.writes.paths(layout)[0].exists():
        return False  # never written: missing is Dagster's to say (or _outputs_gone's)
    try:
        step.writes.check_seal(layout)
    except StageOutputUnreadableError:
        return True
    return False


def outdated_assets(
    instance: dg.DagsterInstance,
    definitions: dg.Definitions,
    keys: Sequence[dg.AssetKey],
    layout: WorkloadLayout,
) -> list[dg.AssetKey]:
    """Those of ``keys`` to materialise again: stale or missing in Dagster's terms, a recorded
    output file gone, or an output damaged since its stage sealed it (in ``layout``)."""
    held = stale_or_missing(instance, definitions, keys)
    # One query for every key's latest materialisation, not one each.
    latest = {
        record.asset_entry.asset_key: record.asset_entry.last_materialization
        for record in instance.get_asset_records(keys)
    }
    return [
        key
        for key in keys
        if key in held or _outputs_gone(latest.get(key)) or _outputs_damaged(layout, key)
    ]


def materialise_stale(
    config_path: Path,
    instance: dg.DagsterInstance,
    target: str,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Record the outside inputs' data versions that changed since Dagster last observed them,
    then materialise, in one in-process run of ``full_report`` on ``instance``, every asset
    ``target`` depends on that is missing or stale, and every asset between those and
    ``target``; returns their keys in the order the graph lists them. A step that fails is an
    :class:`~pipeline.errors.EnginefitError` with its one-line message.

    Stale is Dagster's notion: an input it reads was observed with a new data version, or an
    asset it reads was materialised since. Dagster only sees the second once the upstream asset
    has run, so the assets after a stale one join the same run rather than wait for the next
    call. Missing is never materialised, or a recorded output file gone; an output changed
    since its stage sealed it is materialised again too. ``progress``: as
    :func:`run_full_graph`'s, for the run that materialises them.

    Dagster's stale-status resolver and an observation's data-version tags are not public API:
    :mod:`assets.staleness` holds them.
    """
    definitions = definitions_for(configured_quarter(str(config_path)))
    config = load_config(config_path)
    # What a run of the inputs' observe function records, without a run: a run, its steps and
    # their events cost more than the rest of a decide that finds nothing stale.
    record_data_versions(instance, inputs.input_versions(config))
    graph = definitions.resolve_asset_graph()
    upstream = (
        dg.AssetSelection.assets(target).upstream() - dg.AssetSelection.assets(target)
    ).resolve(graph)
    candidates = [
        key
        for key in upstream
        # A day of a daily-partitioned workload is ingest_days' to run, not decide's.
        if graph.get(key).is_materializable and not graph.get(key).is_partitioned
    ]
    outdated = outdated_assets(instance, definitions, candidates, config.layout())
    rerun = dg.AssetSelection.assets(*outdated).downstream().resolve(graph) & upstream
    stale = [key for key in graph.toposorted_asset_keys if key in rerun]
    if stale:
        _raise_failure(
            run_full_graph(
                config_path, instance, executor="in_process", assets=stale, progress=progress
            )
        )
    return [key.to_user_string() for key in stale]
