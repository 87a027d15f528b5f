"""``enginefit shape [TRACE...]``: the workload shape of the configured workload or of traces."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.commands.common import (
    add_config_argument,
    add_out_argument,
    command_config,
    output_layout,
)
from pipeline.commands.ingest import add_trace_arguments, adhoc_requests
from pipeline.shape import stage
from pipeline.shape.common import json_safe
from pipeline.shape.present import render_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "shape",
        help="workload shape: rates, burstiness, lengths, concurrency, findings",
        description=(
            "Measure the workload shape and place it on the decision axes. Without TRACE: the "
            "configured workload, written to its folder (what the `workload_shape` asset does). "
            "With TRACE (raw traces in any supported format, or canonical Parquet): printed, and "
            "written under --out DIR when given."
        ),
    )
    add_trace_arguments(parser)
    add_out_argument(parser, "shape/ (metrics, facts, figures)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_config_argument(parser)
    parser.set_defaults(func=run_shape)


def run_shape(args: argparse.Namespace) -> int:
    config = command_config(args, paths=args.paths)
    layout = output_layout(args, config)
    if args.paths:
        inputs = stage.ShapeInputs(adhoc_requests(args, config))
    else:
        inputs = stage.read_inputs(config.layout())
    result = stage.run(inputs, config.shape)
    if layout is not None:
        stage.write(result, layout)
    shape = result.to_json()
    if args.json:
        payload = {"shape": shape, "facts": json_safe(result.facts.as_dict())}
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        title = ", ".join(args.paths) if args.paths else config.require_workload().name
        print(render_text(shape, title=f"Workload shape: {title}"))
        note = stage.days_note(inputs)
        if note:
            print(note)
    return 0
