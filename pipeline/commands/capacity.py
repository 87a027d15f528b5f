"""``enginefit capacity``: the configured workload's capacity and cost at its own request mix."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.bench import stage as bench_stage
from pipeline.capacity import stage
from pipeline.capacity.present import render_text
from pipeline.commands.common import add_config_argument, command_config
from pipeline.config import Config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="capacity and cost for the workload's own mix (a serving model per deployment)",
        description=(
            "Fit a serving model per benchmarked deployment from its kept-up load points and "
            "carry it to the configured workload's prompt/output lengths and prefix-cache hits: "
            "capacity at the SLO with its band, replicas at the peak, monthly cost and $/1M "
            "tokens of this workload. Reads the bench, ingest, shape and simulation outputs; "
            "writes capacity/ in the workload folder (what the `workload_capacity` asset does)."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the document as JSON")
    add_config_argument(parser)
    parser.set_defaults(func=run_capacity)


def configured_inputs(config: Config) -> stage.CapacityInputs:
    """What the capacity stage of the configured workload reads, as `enginefit capacity` and
    the ``workload_capacity`` asset read it; bench outputs computed from other inputs than
    the configuration's are an error, never reused silently."""
    bench_stage.require_current(config.layout(), config.bench)
    return stage.read_inputs(
        config.layout(),
        config.requirements.served_model(),
        config.catalog(),
        config.cache_replay(),
    )


def run_capacity(args: argparse.Namespace) -> int:
    config = command_config(args)
    layout = config.layout()
    inputs = configured_inputs(config)
    result = stage.run(inputs, config.capacity)
    stage.write(result, layout)
    resumed = stage.settle_replays(inputs)  # with --json too: the stale passes go either way
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        print(render_text(result))
    for note in resumed:  # beside the JSON, not in it
        print(note, file=sys.stderr if args.json else sys.stdout)
    return 0
