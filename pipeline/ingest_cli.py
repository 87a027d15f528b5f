"""``enginefit ingest``: read trace files into a canonical workload directory and print a summary."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.config import SALT_ENV_VAR, load_config, parse_anchor
from pipeline.errors import ConfigError
from pipeline.ingest import expand_paths, ingest_paths, write_workload
from pipeline.readers import FORMAT_NAMES

DEFAULT_CONFIG = "enginefit.yaml"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="read trace files into the canonical Parquet request table",
        description="Read trace files (any supported format, detected by content; .gz/.zst "
        "stream) into a canonical workload directory: requests/*.parquet, quarantine.parquet "
        "and ingest_summary.json. Prints rows, span and quarantined records by reason.",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace files, globs or directories"
    )
    parser.add_argument("--format", default="auto", choices=["auto", *FORMAT_NAMES])
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per hashed block (default: config, else 16)",
    )
    parser.add_argument(
        "--out", default="data/ingest", help="workload directory to write (default: data/ingest)"
    )
    parser.add_argument(
        "--config",
        default=None,
        help=f"configuration for salt, anchor and tokenizer (default: ./{DEFAULT_CONFIG} if present)",
    )
    parser.add_argument(
        "--anchor", default=None, help="anchor date for relative timestamps (ISO-8601)"
    )
    parser.add_argument(
        "--tokenizer", default=None, help="local tokenizer.json (default: approximate)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_ingest)


def run_ingest(args: argparse.Namespace) -> int:
    config_path = args.config or (DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None)
    workload = load_config(config_path).workload if config_path else None
    salt = os.environ.get(SALT_ENV_VAR) or (workload.hash_salt if workload else "")
    if not salt:
        raise ConfigError(
            f"no hash salt: pass --config with workload.hash_salt or set {SALT_ENV_VAR}"
        )
    block_size = args.block_size or (workload.block_size if workload else 16)
    if block_size <= 0:
        raise ConfigError("--block-size must be positive")
    anchor = (
        parse_anchor(args.anchor, "--anchor")
        if args.anchor
        else (workload.anchor if workload else None)
    )
    tokenizer = args.tokenizer or (workload.tokenizer if workload else None)
    total = sum(s.size() for s in expand_paths(args.paths))
    with tqdm(
        total=total, unit="B", unit_scale=True, desc="ingest", disable=None, file=sys.stderr
    ) as bar:
        result = ingest_paths(
            args.paths,
            fmt=args.format,
            block_size=block_size,
            salt=salt.encode(),
            tokenizer=tokenizer,
            progress=bar.update,
            **({"anchor": anchor} if anchor else {}),
        )
    out = Path(args.out)
    write_workload(result, out)
    if args.json:
        print(json.dumps({**result.summary.to_dict(), "out": str(out)}, indent=2, sort_keys=True))
    else:
        print(result.summary.format_text())
        print(f"wrote {out}/requests/, {out}/quarantine.parquet, {out}/ingest_summary.json")
    return 0
