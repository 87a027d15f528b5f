"""``enginefit ingest``: read trace files into a canonical workload directory and print a summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.cli_common import (
    ADHOC_SALT,
    add_config_argument,
    add_trace_arguments,
    cli_config,
    read_settings,
)
from pipeline.config import SALT_ENV_VAR, parse_anchor
from pipeline.errors import ConfigError
from pipeline.ingest import expand_paths, ingest_paths, write_workload


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="read trace files into the canonical Parquet request table",
        description="Read trace files (any supported format, detected by content; .gz/.zst "
        "stream) into a canonical workload directory: requests/*.parquet, quarantine.parquet "
        "and ingest_summary.json. Prints rows, span and quarantined records by reason.",
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--out", default="data/ingest", help="workload directory to write (default: data/ingest)"
    )
    add_config_argument(parser, "salt, anchor, tokenizer and block size")
    parser.add_argument(
        "--anchor", default=None, help="anchor date for relative timestamps (ISO-8601)"
    )
    parser.add_argument(
        "--tokenizer", default=None, help="local tokenizer.json (default: approximate)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_ingest)


def run_ingest(args: argparse.Namespace) -> int:
    config = cli_config(args.config)
    settings = read_settings(config, args.block_size)
    if settings["salt"] == ADHOC_SALT:  # a persisted workload needs a real, secret salt
        raise ConfigError(
            f"no hash salt: pass --config with workload.hash_salt or set {SALT_ENV_VAR}"
        )
    if args.anchor:
        settings["anchor"] = parse_anchor(args.anchor, "--anchor")
    if args.tokenizer:
        settings["tokenizer"] = args.tokenizer
    total = sum(s.size() for s in expand_paths(args.paths))
    with tqdm(
        total=total, unit="B", unit_scale=True, desc="ingest", disable=None, file=sys.stderr
    ) as bar:
        result = ingest_paths(args.paths, fmt=args.format, progress=bar.update, **settings)
    out = Path(args.out)
    write_workload(result, out)
    if args.json:
        print(json.dumps({**result.summary.to_dict(), "out": str(out)}, indent=2, sort_keys=True))
    else:
        print(result.summary.format_text())
        print(f"wrote {out}/requests/, {out}/quarantine.parquet, {out}/ingest_summary.json")
    return 0
