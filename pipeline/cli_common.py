"""What every command shares: which configuration it uses, and how it gets its requests.

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

import polars as pl

from pipeline.config import Config, default_config, load_config
from pipeline.ingest.compute import load_requests
from pipeline.ingest.readers import FORMAT_NAMES
from pipeline.ingest.stage import adhoc_inputs
from pipeline.layout import WorkloadLayout

DEFAULT_CONFIG = "enginefit.yaml"
FORMAT_HELP = (
    "the traces' format (default auto: detected by content); another CSV or JSON Lines layout "
    "is read with format: columns in the configuration's workload.traces"
)


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"configuration file (default: ./{DEFAULT_CONFIG} when present, else built-in "
        "defaults)",
    )


def add_trace_arguments(
    parser: argparse.ArgumentParser,
    *,
    block_help: str = "tokens per hashed block (default: the configuration's)",
    required: bool = False,
) -> None:
    """TRACE... (into ``args.paths``), ``--format`` and ``--block-size``."""

    parser.add_argument(
        "paths",
        nargs="+" if required else "*",
        metavar="TRACE",
        help="trace files, globs, folders or canonical Parquet (none: the configured workload)",
    )
    parser.add_argument(
        "--format", default="auto", choices=["auto", *FORMAT_NAMES], help=FORMAT_HELP
    )
    parser.add_argument("--block-size", type=int, default=None, help=block_help)


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


def adhoc_requests(args: argparse.Namespace, config: Config) -> pl.LazyFrame:
    """The canonical table of the traces named on the command line (canonical Parquet is
    scanned as is; anything else is read with the configuration's settings, not persisted)."""

    inputs = adhoc_inputs(args.paths, config, fmt=args.format, block_size=args.block_size)
    return load_requests(args.paths, inputs.context, fmt=args.format)


def output_layout(args: argparse.Namespace, config: Config) -> WorkloadLayout | None:
    """Where a stage command writes: the configured workload, ``--out DIR`` ad hoc, or nowhere."""
    if not args.paths:
        return config.layout()
    out: Path | None = getattr(args, "out", None)
    return WorkloadLayout(out) if out is not None else None
