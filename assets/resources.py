"""The one resource every asset reads through: the configuration, and the layout it implies."""

from __future__ import annotations

import dagster as dg

from pipeline.config import Config, load_config
from pipeline.layout import WorkloadLayout


class EnginefitStore(dg.ConfigurableResource):
    """The configuration file and the workload folder derived from it.

    Tests pass ``EnginefitStore(config_path=str(tmp_path / "enginefit.yaml"))``; the default
    is the bundled ``enginefit.yaml`` at the repository root.
    """

    config_path: str = "enginefit.yaml"

    def config(self) -> Config:
        return load_config(self.config_path)

    def layout(self) -> WorkloadLayout:
        """``<data_dir>/<workload name>``: every output of the workload (pipeline.layout)."""
        return self.config().layout()
