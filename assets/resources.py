"""The one resource every asset reads through: where the configuration and outputs live."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipeline.config import Config, load_config


class EnginefitStore(dg.ConfigurableResource):
    """The configuration file and the directories derived from it.

    Tests pass ``EnginefitStore(config_path=str(tmp_path / "enginefit.yaml"))``; the default
    is the bundled ``enginefit.yaml`` at the repository root.
    """

    config_path: str = "enginefit.yaml"

    def config(self) -> Config:
        return load_config(self.config_path)

    def workload_dir(self) -> Path:
        """``<data_dir>/<workload name>``: the canonical table and every derived data file."""
        cfg = self.config()
        return cfg.paths.data_dir / cfg.workload.name

    def stage_dir(self, stage: str) -> Path:
        """A per-stage output folder under the workload dir (e.g. ``shape``, ``simulation``)."""
        path = self.workload_dir() / stage
        path.mkdir(parents=True, exist_ok=True)
        return path
