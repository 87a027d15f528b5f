"""``enginefit prefix``: the shared-prefix curve, reuse potential and sessions of trace files."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from pipeline.cli_common import (
    add_config_argument,
    add_trace_arguments,
    cli_config,
    load_trace_requests,
)
from pipeline.prefix.config import PrefixConfig, parse_prefix_config
from pipeline.prefix.report import analyse, curve_markdown, reuse_markdown


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prefix",
        help="shared-prefix curve, prefix-cache reuse potential and sessions of traces",
        description="Shared-prefix ratio by window W (count and prompt-token weighted), the "
        "curve's shape, the prompt tokens an unbounded prefix cache could serve (by age of the "
        "prefix and across tenants), and sessions (logged or inferred). JSON keys: docs/prefix.md.",
    )
    add_trace_arguments(
        parser,
        block_help="tokens per block: hash content traces at this size and analyse at it "
        "(block-id traces and canonical Parquet are coarsened to it; a multiple of theirs)",
    )
    add_config_argument(parser, "salt, anchor, block size and the prefix section")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_prefix)


def run_prefix(args: argparse.Namespace) -> int:
    cfg = cli_config(args.config)
    prefix_config = parse_prefix_config(cfg.section("prefix")) if cfg else PrefixConfig()
    requests = load_trace_requests(
        args.paths, fmt=args.format, block_size=args.block_size, config=cfg
    ).collect()
    if not requests["arrival"].is_sorted():
        requests = requests.sort("arrival", maintain_order=True)
    if args.block_size is not None:
        prefix_config = replace(prefix_config, block_size=args.block_size)
    result = analyse(requests, prefix_config)
    if args.json:
        print(json.dumps(result.summary, indent=2, sort_keys=True, default=str))
    else:
        print(format_text(result.summary))
    return 0


def format_text(summary: dict[str, Any]) -> str:
    """The summary for a terminal: counts, the curve table, reuse and sessions."""
    size = summary["block_size"]
    head = (
        f"{summary['requests']:,} requests ({summary['requests_hashes_unknown']:,} without "
        "prefix hashes), "
        + (f"block size {size} tokens" if size else "no prefix hashes: nothing can be shared")
    )
    reuse = summary["reuse"]
    share = reuse["hit_share"]
    reuse_line = (
        f"Unbounded prefix cache could serve {reuse['hit_tokens']:,} of "
        f"{reuse['prompt_tokens']:,} prompt tokens"
        + (f" ({100 * share:.1f} %)" if share is not None else "")
    )
    return "\n\n".join([head, curve_markdown(summary), reuse_line, reuse_markdown(summary)])
