"""``enginefit``: the command line. Each area registers its own subcommands.

Every subcommand is a function ``run(args) -> int`` registered by ``register(subparsers)`` in
its area's ``cli`` module; this file only builds the parser, dispatches, and turns an
:class:`~pipeline.errors.EnginefitError` into a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pipeline import config_cli
from pipeline.bench import cli as bench_cli
from pipeline.errors import EnginefitError
from pipeline.ingest import cli as ingest_cli
from pipeline.prefix import cli as prefix_cli
from pipeline.shape import cli as shape_cli
from pipeline.sim import cli as sim_cli

# Each module here has ``register(subparsers)``; keep one line per area.
_AREAS = [
    config_cli,
    ingest_cli,
    shape_cli,
    prefix_cli,
    sim_cli,
    bench_cli,
]


def build_parser(extra: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginefit",
        description="Which LLM inference engine fits your traffic, and what it costs at your SLO.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for area in _AREAS:
        area.register(subparsers)
    for register in extra:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(), argv)


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except EnginefitError as exc:
        print(f"enginefit: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
