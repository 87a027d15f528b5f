"""``enginefit ingest``: trace files into a canonical workload folder, with a summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.cli_common import add_config_argument, add_trace_arguments, command_config
from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.ingest import stage
from pipeline.ingest.present import summary_text
from pipeline.layout import WorkloadLayout
from pipeline.settings import parse_instant
from pipeline.store import claim_workload


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
            inputs = stage.adhoc_inputs(
                args.paths,
                config,
                fmt=args.format,
                block_size=args.block_size,
                anchor=anchor,
                tokenizer=args.tokenizer,
                persist=True,
                progress=bar.update,
            )
        else:
            inputs = stage.read_inputs(config, progress=bar.update)
        bar.total = inputs.total_bytes()
        result = stage.run(inputs)
        paths = stage.write(result, layout)
    if args.json:
        payload = {**result.summary.to_json(), "out": str(layout.root)}
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(summary_text(result.summary))
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
