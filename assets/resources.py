"""The one resource every asset reads through: the configuration, and the layout it implies."""

from __future__ import annotations

import dataclasses

import dagster as dg

from assets.inputs import step_reads
from pipeline.commands.common import DEFAULT_CONFIG
from pipeline.config import Config, load_config
from pipeline.layout import WorkloadLayout
from pipeline.mirror import pull

# The steps (run, op) this process has brought what they read to its mirror for.
_PULLED: set[tuple[str, str]] = set()


class EnginefitStore(dg.ConfigurableResource):
    """The configuration file and the workload folder derived from it.

    Tests pass ``EnginefitStore(config_path=str(tmp_path / "enginefit.yaml"))``; the default
    is the bundled ``enginefit.yaml`` at the repository root.
    """

    config_path: str = DEFAULT_CONFIG
    # The quarter to report on (YYYY-Qn); the quarterly schedule sets it for the quarter that
    # ended. None: the configuration's report.quarter, else the data's.
    quarter: str | None = None

    def config(self) -> Config:
        config = load_config(self.config_path)
        if self.quarter is not None:
            config = dataclasses.replace(config, report=config.report.replace(quarter=self.quarter))
        _pull_what_the_step_reads(config)
        return config

    def layout(self) -> WorkloadLayout:
        """``<data_dir>/<workload name>``: every output of the workload (pipeline.layout)."""
        return self.config().layout()


def _pull_what_the_step_reads(config: Config) -> None:
    """Where ``paths`` name object storage: the sets the running step reads (its declared
    upstream results, :func:`assets.inputs.step_reads`), brought to this machine's mirror when
    the step first asks for the configuration (:mod:`pipeline.mirror`). Each step under the
    multiprocess, k8s and Celery executors may be a machine of its own: it fetches what it
    reads, not the workload."""
    paths = config.paths
    if config.workload is None or (paths.data_mirror is None and paths.reports_mirror is None):
        return
    try:
        context = dg.OpExecutionContext.get()
    except dg.DagsterInvariantViolationError:
        return  # not in a step: nothing runs on the workload
    step = (context.run_id, str(context.node_handle))
    if step in _PULLED:
        return
    layout = config.layout()
    wanted, versions = step_reads(
        layout,
        (key.to_user_string() for key in context.selected_asset_keys),
        (key.asset_key.to_user_string() for key in context.selected_asset_check_keys),
        daily=config.workload.daily_quarter is not None,
        partition=context.partition_key if context.has_partition_key else None,
    )
    pull(layout, config.filing().tree, wanted, reports=versions)
    _PULLED.add(step)
