"""``enginefit prefix [TRACE...]``: shared-prefix curve, reuse potential and sessions."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.commands.common import (
    add_config_argument,
    add_out_argument,
    command_config,
    output_layout,
)
from pipeline.commands.ingest import add_trace_arguments, adhoc_requests
from pipeline.prefix import stage
from pipeline.prefix.present import summary_text
from pipeline.settings import with_flags


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prefix",
        help="shared-prefix curve, prefix-cache reuse potential and sessions",
        description="Shared-prefix ratio by window W (count and prompt-token weighted), the "
        "curve's shape, the prompt tokens an unbounded prefix cache could serve (by age of the "
        "prefix and across tenants), and sessions (logged or inferred). Without TRACE: the "
        "configured workload, written to its folder (what the `prefix_sharing` asset does). "
        "JSON keys: docs/prefix.md.",
    )
    add_trace_arguments(
        parser,
        block_help="ad hoc: hash content traces at this size and analyse at it (block-id "
        "traces and canonical Parquet are coarsened to it; a multiple of theirs)",
    )
    add_out_argument(parser, "prefix/ (summary, curve, sessions, figure)")
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run_prefix)


def run_prefix(args: argparse.Namespace) -> int:
    config = command_config(args, paths=args.paths)
    settings = config.prefix
    if args.paths:
        # ad hoc: the --out folder, if any (a large table's sessions are written beside it)
        layout = output_layout(args, config)
        inputs = stage.inputs_from(adhoc_requests(args, config), layout)
        if args.block_size is not None:
            settings = with_flags(settings, {"block_size": ("--block-size", args.block_size)})
    else:
        inputs = stage.read_inputs(config.layout())
    result = stage.run(inputs, settings)
    if not args.paths:
        layout = output_layout(args, config)
    if layout is not None:
        stage.write(result, layout)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True, default=str))
        for line in inputs.said:  # what was read back: never part of the result
            print(line, file=sys.stderr)
    else:
        print(summary_text(result.summary))
        for line in inputs.said:
            print(line)
    return 0
