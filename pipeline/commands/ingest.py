"""``enginefit ingest``: trace files into a canonical workload folder, with a summary."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from tqdm import tqdm

from pipeline.commands.common import add_config_argument, command_config
from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.ingest import stage
from pipeline.ingest.compute import load_requests
from pipeline.ingest.present import summary_text
from pipeline.ingest.readers import FORMAT_NAMES
from pipeline.layout import WorkloadLayout
from pipeline.settings import parse_instant
from pipeline.store import claim_workload

FORMAT_HELP = (
    "the traces' format (default auto: detected by content); another CSV or JSON Lines layout "
    "is read with format: columns in the configuration's workload.traces"
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="read trace files into the canonical Parquet request table",
        description="Read trace files (any supported format, detected by content; .gz/.zst "
        "stream) into a canonical workload folder: requests/*.parquet, quarantine.parquet and "
        "ingest_summary.json. Without TRACE: the configured workload's traces into its folder "
        "(what the `workload` asset does). Prints rows, span and quarantined records by reason.",
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=None,
        help="ad hoc: the workload folder to write (default: data/ingest)",
    )
    add_config_argument(parser)
    parser.add_argument(
        "--anchor", default=None, help="anchor date for relative timestamps (ISO-8601)"
    )
    parser.add_argument(
        "--tokenizer", default=None, help="local tokenizer.json (default: approximate)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_ingest)


def run_ingest(args: argparse.Namespace) -> int:
    config = command_config(args, paths=args.paths)
    layout = _output_layout(args, config)
    # Claimed from the start: a folder that may not be written, or that another command is
    # writing, is refused before any trace is read.
    with (
        claim_workload(layout),
        tqdm(unit="B", unit_scale=True, desc="ingest", disable=None, file=sys.stderr) as bar,
    ):
        if args.paths:
            try:
                anchor = parse_instant(args.anchor) if args.anchor else None
            except ValueError as exc:
                raise ConfigError(f"--anchor: {exc}") from exc
            inputs = adhoc_inputs(
                args,
                config,
                anchor=anchor,
                tokenizer=args.tokenizer,
                persist=True,
                progress=bar.update,
            )
        else:
            inputs = configured_inputs(config, progress=bar.update)
        bar.total = inputs.total_bytes()
        merged = stage.run_publish(inputs, layout)
    if args.json:
        payload = {**merged.summary.to_json(), "out": str(layout.root)}
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(summary_text(merged.summary))
        paths = merged.paths
        print("wrote " + ", ".join(str(paths[k]) for k in ("requests", "quarantine", "summary")))
    return 0


def _output_layout(args: argparse.Namespace, config: Config) -> WorkloadLayout:
    if args.paths:
        return WorkloadLayout(args.out or Path("data/ingest"))
    if args.block_size or args.anchor or args.tokenizer or args.out:
        raise ConfigError(
            "--block-size, --anchor, --tokenizer and --out apply to TRACE paths; the "
            "configured workload uses its configuration"
        )
    return config.layout()


def configured_inputs(
    config: Config, progress: Callable[[int], None] | None = None
) -> stage.IngestInputs:
    """The configured workload's trace files, as `enginefit ingest` and the ``workload`` asset
    read them."""
    return stage.read_inputs(config.require_workload(), config.base, progress)


def add_trace_arguments(
    parser: argparse.ArgumentParser,
    *,
    block_help: str = "tokens per hashed block (default: the configuration's)",
    required: bool = False,
) -> None:
    """TRACE... (into ``args.paths``), ``--format`` and ``--block-size``: what every command that
    reads trace files named on the command line takes."""

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


def adhoc_inputs(args: argparse.Namespace, config: Config, **flags: Any) -> stage.IngestInputs:
    """The traces named on the command line (``args.paths``, ``--format``, ``--block-size``),
    read with the configuration's settings and ``flags``
    (:func:`pipeline.ingest.stage.adhoc_inputs`)."""
    salt = config.workload.hash_salt if config.workload else None
    return stage.adhoc_inputs(
        args.paths, config.read, salt, fmt=args.format, block_size=args.block_size, **flags
    )


def adhoc_requests(args: argparse.Namespace, config: Config) -> pl.LazyFrame:
    """The canonical table of the traces named on the command line (canonical Parquet is
    scanned as is; anything else is read with the configuration's settings, not persisted)."""
    inputs = adhoc_inputs(args, config)
    return load_requests(args.paths, inputs.context, fmt=args.format)
