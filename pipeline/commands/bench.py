"""``enginefit bench``: SLO capacity, cost per 1M tokens and validity of benchmark results.

    enginefit bench [--config FILE] [--json]                  # the configured bench.results
    enginefit bench PATH... [--manifest FILE] [--slo ttft_p95_ms=1000,itl_p99_ms=60]
                            [--gpu-hour-usd 3.0] [--interpolate] [--as-of 2026-11-29]
                            [--config FILE] [--workload-facts FILE|DIR] [--out DIR] [--json]

Without PATH: the configured results and workload, written to its folder exactly as the
``bench_*`` assets write them. With PATH: those result files, printed, and written under
``--out DIR`` (a workload folder: ``DIR/bench/``) when given. Settings (SLO, prices, checks)
come from the configuration's ``bench`` section; flags override them (``--slo`` replaces the
latency limits; its options not named keep the configured ones). The age check's date is
``--as-of``, else ``bench.as_of``, else the ``ENGINEFIT_RUN_DATE`` environment variable (the report
date, :mod:`pipeline.dates`); without any it reports ``unknown`` (the decision measures the age
from its own date). A run dated after it, or after today, is an error naming its file.

Workload facts (fleet sizing, the production checks): without PATH, the configured workload's
shape and prefix outputs. With PATH, only what ``--workload-facts`` names -- a facts file
(``shape/workload_facts.json``, or what ``enginefit shape --json`` prints) or a workload folder
(its shape and prefix outputs, e.g. the configured workload's ``data/<name>``): someone else's
result files are never checked against a workload that happens to be configured in the current
folder. The output's first lines say which facts and which prices were used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.bench import stage
from pipeline.bench.config import BenchConfig, as_of_flag, parse_slo_spec
from pipeline.bench.present import render_text
from pipeline.bench.result import analysis_payload
from pipeline.bench.validity import load_workload_facts
from pipeline.commands.common import add_config_argument, add_out_argument, command_config
from pipeline.config import Config
from pipeline.costing import parse_price
from pipeline.errors import ConfigError
from pipeline.layout import WorkloadLayout
from pipeline.settings import with_flags
from pipeline.shape.facts import WorkloadFacts


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="SLO capacity, cost per 1M tokens and validity of benchmark result files",
        description=(__doc__ or "").replace("``", ""),  # the docstring, as plain text
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="result files or folders (none: the configured bench.results)",
    )
    parser.add_argument(
        "--manifest",
        type=Path,
        metavar="FILE",
        help="manifest YAML merged over the sidecars: engine, GPU, price, date (config key "
        "bench.manifest)",
    )
    parser.add_argument(
        "--slo", help="limits, e.g. ttft_p95_ms=1000,itl_p99_ms=60[,itl_definition=per-gap]"
    )
    parser.add_argument(
        "--gpu-hour-usd", type=float, help="$ per GPU-hour for every GPU type (overrides config)"
    )
    parser.add_argument(
        "--interpolate",
        action="store_true",
        help="interpolate capacity between the last pass and first failure (marked)",
    )
    parser.add_argument("--as-of", help="date for the six-month age check (YYYY-MM-DD)")
    add_config_argument(parser)
    parser.add_argument(
        "--workload-facts",
        type=Path,
        metavar="FILE|DIR",
        help="with PATH: check against these workload facts (shape/workload_facts.json, "
        "`enginefit shape --json` output, or a workload folder); none: no fleet, checks unknown",
    )
    add_out_argument(parser, "bench/ (points, capacity, findings, figures)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run_bench)


def resolve_settings(args: argparse.Namespace, config: Config) -> BenchConfig:
    """The configuration's ``bench`` section, then command-line overrides, each validated as the
    configuration is (a bad value is one line naming the flag)."""
    settings = config.bench
    flags: dict[str, tuple[str, Any]] = {}
    if args.slo is not None:
        flags["slo"] = ("--slo", parse_slo_spec(args.slo, settings.slo))
    if args.gpu_hour_usd is not None:
        price = parse_price(args.gpu_hour_usd, "--gpu-hour-usd")
        flags["prices"] = ("--gpu-hour-usd", dataclasses.replace(settings.prices, override=price))
    if args.interpolate:
        flags["interpolate"] = ("--interpolate", True)
    if args.manifest is not None:
        if not args.manifest.is_file():
            raise ConfigError(f"--manifest: {args.manifest}: no such manifest file")
        flags["manifest"] = ("--manifest", args.manifest)
    as_of = as_of_flag(args.as_of, settings)
    if as_of is not None:
        flags["as_of"] = as_of
    return with_flags(settings, flags)


def adhoc_facts(path: Path | None, config: Config) -> tuple[WorkloadFacts | None, str]:
    """The workload facts ad hoc results are checked against, and where they came from: only
    what ``--workload-facts`` names (a facts file, or a workload folder's shape and prefix
    outputs), never the configured workload unasked."""
    if path is None:
        named = (
            f"; the configured workload {config.workload.name} is used only when named: "
            f"--workload-facts {config.layout().root}"
            if config.workload is not None
            else ""
        )
        return None, f"none (ad hoc: give --workload-facts FILE|DIR to check against one{named})"
    if path.is_dir():
        layout = WorkloadLayout(path)
        facts, source = stage.workload_facts(layout, f"workload folder {path}")
        if facts is None:
            raise ConfigError(
                f"--workload-facts: {path} is a folder without shape results "
                f"({layout.shape.summary} is missing); write them with `enginefit shape "
                f"TRACE... --out {path}`, or name a facts file"
            )
        return facts, source
    if not path.is_file():
        raise ConfigError(f"--workload-facts: {path}: no such file or folder")
    return load_workload_facts(path), str(path)


def run_bench(args: argparse.Namespace) -> int:
    config = command_config(args, paths=args.paths)
    settings = resolve_settings(args, config)
    days = None
    if args.paths:
        results = stage.read_results(settings, [Path(p) for p in args.paths])
        facts, source = adhoc_facts(args.workload_facts, config)
        inputs = stage.BenchInputs(results, facts, source, settings.as_of)
        analysis = stage.run(inputs, settings)
        if args.out is not None:
            stage.write(analysis, WorkloadLayout(args.out))
    else:
        if args.workload_facts is not None:
            raise ConfigError(
                "--workload-facts applies to PATH results; the configured workload's facts "
                "come from its shape and prefix outputs"
            )
        analysis, days = stage.run_configured(config.layout(), settings, config.shape.latency)
    if args.json:
        print(json.dumps(analysis_payload(analysis), indent=2, sort_keys=True, default=str))
        if days is not None:  # beside the JSON, not in it
            print(f"concurrency by engine: {days}", file=sys.stderr)
    else:
        print(render_text(analysis))
        if days is not None:
            print(f"concurrency by engine: {days}")
    return 0
