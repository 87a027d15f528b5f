"""``enginefit explain``, and the deciding and printing ``enginefit decide`` does after Dagster has
materialised what the decision reads (the command itself is :mod:`assets.cli`'s)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.bench import stage as bench_stage
from pipeline.bench.config import as_of_flag
from pipeline.config import Config
from pipeline.decision import stage
from pipeline.decision.context import DecisionInputs
from pipeline.decision.present import candidates_table, rationale_text
from pipeline.settings import with_flags


def register(subparsers: Any) -> None:
    explain = subparsers.add_parser(
        "explain",
        help="print a decision record's rationale as plain text",
        description="Print a decision record (decision/decision.json) as prose a reviewer reads "
        "top to bottom: the answer, the candidates, the rules with their evidence, the triggers.",
    )
    explain.add_argument(
        "record",
        type=Path,
        metavar="RECORD",
        help="a decision.json (data/<workload>/decision/ or a published report version)",
    )
    explain.set_defaults(func=run_explain)


def decide_config(args: argparse.Namespace, config: Config) -> Config:
    """The configuration ``decide`` runs with, its flags applied and checked: called before
    Dagster materialises anything, so a wrong flag costs no run. ``--previous`` is read once
    here for the same reason (and read again by the decision)."""
    as_of = as_of_flag(args.as_of, config.bench)
    if as_of is not None:
        config = dataclasses.replace(config, bench=with_flags(config.bench, {"as_of": as_of}))
    if args.previous is not None:
        stage.read_previous(args.previous)
    return config


def configured_inputs(config: Config, previous: Path | None = None) -> DecisionInputs:
    """What the decision of the configured workload reads, as `enginefit decide` and the
    ``engine_decision`` asset read it: a previous record to check is ``previous``, else
    ``decision.previous_record``, else the version a new report would compare with. Bench
    outputs computed from other inputs than the configuration's are an error."""
    bench_stage.require_current(config.layout(), config.bench)
    return stage.read_inputs(
        config.layout(),
        config.decision,
        config.bench.policy(),
        filing=config.filing(),
        previous=previous or config.decision.previous_record,
    )


def decide(args: argparse.Namespace, config: Config) -> int:
    """The decision (``config`` from :func:`decide_config`) on the upstream results already
    written, saved and printed."""
    inputs = configured_inputs(config, args.previous)
    record = stage.run(inputs, config.requirements, config.decision)
    paths = stage.write(record, config.layout())
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
