"""``enginefit shape TRACE...``: print the workload shape of one or more traces."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.cli_common import (
    add_config_argument,
    add_trace_arguments,
    cli_config,
    load_trace_requests,
)
from pipeline.shape.common import json_safe
from pipeline.shape.config import ShapeConfig, parse_shape_config
from pipeline.shape.report import compute_shape, facts_from_shape, render_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "shape",
        help="workload shape of traces: rates, burstiness, lengths, concurrency, findings",
        description=(
            "Measure the workload shape of one or more traces (raw trace files in any supported "
            "format, or canonical Parquet) and place it on the decision axes."
        ),
    )
    add_trace_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_config_argument(parser, "salt, anchor, block size and the shape section")
    parser.set_defaults(func=run_shape)


def run_shape(args: argparse.Namespace) -> int:
    config = cli_config(args.config)
    cfg = (
        parse_shape_config(config.section("shape"), str(config.source)) if config else ShapeConfig()
    )
    requests = load_trace_requests(
        args.paths, fmt=args.format, block_size=args.block_size, config=config
    )
    result = compute_shape(requests, cfg)
    shape = result.to_json()
    if args.json:
        payload = {"shape": shape, "facts": json_safe(facts_from_shape(result).as_dict())}
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        print(render_text(shape, title=f"Workload shape: {', '.join(args.paths)}"))
    return 0
