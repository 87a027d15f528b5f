"""``enginefit decide`` and ``enginefit explain``.

    enginefit decide [--config FILE] [--previous RECORD] [--as-of YYYY-MM-DD] [--json]
    enginefit explain RECORD

``decide`` runs, for the configured workload, every upstream stage whose outputs are missing
(ingest, shape, prefix, simulation, bench), then the decision, and writes the record under
``decision/`` exactly as the ``engine_decision`` asset does. ``--previous`` evaluates an earlier
quarter's revisit triggers against this run's measurements. ``explain`` prints a record's
rationale as plain text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.bench.config import as_of_flag
from pipeline.cli_common import add_config_argument, command_config
from pipeline.config import Config
from pipeline.decision import stage
from pipeline.decision.present import candidates_table, rationale_text
from pipeline.layout import WorkloadLayout
from pipeline.settings import with_flags


def register(subparsers: Any) -> None:
    decide = subparsers.add_parser(
        "decide",
        help="recommend an engine with its rationale, costs and revisit triggers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_argument(decide)
    decide.add_argument(
        "--previous",
        type=Path,
        metavar="RECORD",
        help="a previous decision.json whose triggers to check",
    )
    decide.add_argument(
        "--as-of",
        metavar="YYYY-MM-DD",
        help="the decision's date (default: bench.as_of, else ENGINEFIT_RUN_DATE)",
    )
    decide.add_argument("--json", action="store_true", help="print the record as JSON")
    decide.set_defaults(func=run_decide)
    explain = subparsers.add_parser(
        "explain",
        help="print a decision record's rationale as plain text",
        description="Print a decision record (decision/decision.json) as prose a reviewer reads "
        "top to bottom: the answer, the candidates, the rules with their evidence, the triggers.",
    )
    explain.add_argument("record", type=Path, metavar="RECORD")
    explain.set_defaults(func=run_explain)


def ensure_upstream(config: Config, layout: WorkloadLayout) -> list[str]:
    """Run every upstream stage whose outputs are missing or were made under another
    configuration or from other input files (:mod:`pipeline.decision.upstream`); returns their
    names, in order."""
    from pipeline.bench import stage as bench_stage
    from pipeline.decision.upstream import ensure
    from pipeline.ingest import stage as ingest_stage
    from pipeline.prefix import stage as prefix_stage
    from pipeline.shape import stage as shape_stage
    from pipeline.sim import stage as sim_stage

    def ingest() -> None:
        ingest_stage.write(ingest_stage.run(ingest_stage.read_inputs(config)), layout)

    def shape() -> None:
        inputs = shape_stage.read_inputs(layout, config)
        shape_stage.write(shape_stage.run(inputs, config.shape), layout)

    def prefix() -> None:
        inputs = prefix_stage.read_inputs(layout, config)
        prefix_stage.write(prefix_stage.run(inputs, config.prefix), layout)

    def simulation() -> None:
        result = sim_stage.run(sim_stage.read_inputs(layout, config), config.simulation)
        sim_stage.write(result, layout)

    def bench() -> None:
        bench_stage.run_configured(layout, config.bench, config.shape.latency)

    steps = {"ingest": ingest, "shape": shape, "prefix": prefix, "simulation": simulation}
    return ensure(config, layout, {**steps, "bench": bench})


def run_decide(args: argparse.Namespace) -> int:
    config = command_config(args)
    layout = config.layout()
    as_of = as_of_flag(args.as_of, config.bench)
    if as_of is not None:
        config = dataclasses.replace(config, bench=with_flags(config.bench, {"as_of": as_of}))
    previous = args.previous or config.decision.previous_record
    ran = ensure_upstream(config, layout)
    if ran:
        print(
            f"enginefit decide: ran the upstream stages that were missing or out of date: "
            f"{', '.join(ran)}",
            file=sys.stderr,
        )
    record = stage.run(
        stage.read_inputs(layout, config, as_of=config.bench.as_of, previous=previous), config
    )
    paths = stage.write(record, layout)
    if args.json:
        print(json.dumps(record.to_json(), indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    print(record.recommendation.headline)
    print()
    print(candidates_table(record))
    print()
    print(f"rationale: enginefit explain {paths['record']}  (also {paths['rationale']})")
    return 0


def run_explain(args: argparse.Namespace) -> int:
    record = stage.read_previous(args.record)
    sys.stdout.write(rationale_text(record))
    return 0
