"""What every command shares: which configuration it uses, and where it writes.

Each command takes ``--config FILE`` (default: ``./enginefit.yaml`` when present, else the
built-in defaults) and says on standard error, before anything else, which configuration and
workload it used. A stage command runs in one of two modes:

* **configured** (no trace paths): the stage of the configured workload, exactly as the Dagster
  asset runs it (same inputs through the layout, same outputs);
* **ad hoc** (trace paths given): the given traces, read with the configuration's settings;
  results are printed, and written only under ``--out DIR`` (``ingest`` always writes: to
  ``data/ingest`` unless ``--out`` names another folder).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.config import Config, default_config, load_config
from pipeline.layout import WorkloadLayout
from pipeline.mirror import pull

DEFAULT_CONFIG = "enginefit.yaml"


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"configuration file (default: ./{DEFAULT_CONFIG} when present, else built-in "
        "defaults)",
    )


def add_out_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"ad hoc: also write {what} under DIR (a workload folder)",
    )


def cli_config(path: str | Path | None) -> Config:
    """The named configuration, else ``./enginefit.yaml`` when it exists, else the defaults."""
    if path is not None:
        return load_config(path)
    if Path(DEFAULT_CONFIG).is_file():
        return load_config(DEFAULT_CONFIG)
    return default_config()


def command_config(args: argparse.Namespace, *, paths: Sequence[str] = ()) -> Config:
    """The configuration for a command, announced on standard error with the workload used."""
    config = cli_config(args.config)
    if paths:
        workload = f"workload: {', '.join(str(p) for p in paths)} (ad hoc)"
    elif config.workload is not None:
        workload = f"workload: {config.workload.name} ({config.layout().root})"
    else:
        workload = "workload: none configured"
    print(f"enginefit {args.command}: {config.describe()}; {workload}", file=sys.stderr)
    return config


def output_layout(args: argparse.Namespace, config: Config) -> WorkloadLayout | None:
    """Where a stage command writes: the configured workload, ``--out DIR`` ad hoc, or nowhere."""
    if not args.paths:
        layout = config.layout()
        pull(layout, config.filing().tree)  # the folders on object storage, when they are
        return layout
    out: Path | None = getattr(args, "out", None)
    return WorkloadLayout(out) if out is not None else None
