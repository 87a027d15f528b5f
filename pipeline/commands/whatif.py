"""``enginefit whatif``: the decision re-run on the configured scenarios and over the map."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.bench import stage as bench_stage
from pipeline.commands.common import add_config_argument, command_config
from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.whatif import stage
from pipeline.whatif.compute import WhatifInputs
from pipeline.whatif.present import render_text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "whatif",
        help="re-run the decision on named scenarios and over a map of two axes",
        description=(
            "Re-run the decision (rules, cost ranking, payback) on the changed inputs of each "
            "scenario in whatif.scenarios, and over a grid of two axes (the decision map: the "
            "winning engine at each point, ties marked). Nothing upstream re-runs: it reads "
            "what `enginefit decide` read, so run that first. Writes whatif/whatif.json in the "
            "workload folder (what the `decision_map` asset does). How each change is applied: "
            "docs/whatif.md."
        ),
    )
    add_config_argument(parser)
    parser.add_argument(
        "--scenario",
        metavar="NAME",
        default=None,
        help="run only this scenario of whatif.scenarios (default: every one)",
    )
    parser.add_argument(
        "--map",
        metavar="X,Y",
        default=None,
        dest="axes",
        help="the map's two axes, of traffic, model_changes, gpu_price and prefix_share "
        "(default: whatif.map.x and whatif.map.y; ranges from whatif.map)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON (one entry per scenario and per map cell)",
    )
    parser.set_defaults(func=run_whatif)


def configured_inputs(config: Config) -> WhatifInputs:
    """What the what-if of the configured workload reads, as `enginefit whatif` and the
    ``decision_map`` asset read it. Bench outputs computed from other inputs than the
    configuration's are an error."""
    bench_stage.require_current(config.layout(), config.bench)
    return stage.read_inputs(
        config.layout(),
        config.whatif,
        decision=config.decision,
        requirements=config.requirements,
        bench=config.bench,
        replay=config.cache_replay(),
    )


def run_whatif(args: argparse.Namespace) -> int:
    config = command_config(args)
    scenarios = config.whatif.scenarios
    if args.scenario is not None and args.scenario not in scenarios:
        named = ", ".join(sorted(scenarios)) or "none configured"
        raise ConfigError(
            f"--scenario: no scenario {args.scenario!r} in whatif.scenarios of {config.where} "
            f"(named: {named})"
        )
    inputs = configured_inputs(config)
    result = stage.run(inputs, config.whatif, scenario=args.scenario, axes=args.axes)
    stage.write(result, config.layout())
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(result), end="")
    return 0
