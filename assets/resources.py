"""The one resource every asset reads through: the configuration, and the layout it implies."""

from __future__ import annotations

import dataclasses

import dagster as dg

from pipeline.commands.common import DEFAULT_CONFIG
from pipeline.config import Config, load_config
from pipeline.errors import ConfigError
from pipeline.layout import WorkloadLayout
from pipeline.mirror import pull


class EnginefitStore(dg.ConfigurableResource):
    """The configuration file and the workload folder derived from it.

    Tests pass ``EnginefitStore(config_path=str(tmp_path / "enginefit.yaml"))``; the default
    is the bundled ``enginefit.yaml`` at the repository root.
    """

    config_path: str = DEFAULT_CONFIG
    # The quarter to report on (YYYY-Qn); the quarterly schedule sets it for the quarter that
    # ended. None: the configuration's report.quarter, else the data's.
    quarter: str | None = None

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Where ``paths`` name object storage, bring the local mirror up to it before any
        step of this process reads (each step's process under the multiprocess and cluster
        executors; once per run in process): :mod:`pipeline.mirror`."""
        try:
            config = self.config()
        except ConfigError:
            return  # said by the first step that reads it, as that step's failure
        if config.workload is not None:
            pull(config.layout(), config.filing().tree)

    def config(self) -> Config:
        config = load_config(self.config_path)
        if self.quarter is None:
            return config
        return dataclasses.replace(config, report=config.report.replace(quarter=self.quarter))

    def layout(self) -> WorkloadLayout:
        """``<data_dir>/<workload name>``: every output of the workload (pipeline.layout)."""
        return self.config().layout()
