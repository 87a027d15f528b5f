"""``enginefit bench``: SLO capacity, cost per 1M tokens and validity of benchmark results.

    enginefit bench PATH... [--manifest FILE] [--slo ttft_p95_ms=1000,itl_p99_ms=60]
                            [--gpu-hour-usd 3.0] [--interpolate] [--as-of 2026-11-29]
                            [--config enginefit.yaml] [--workload-facts FILE] [--out DIR] [--json]

Settings come from ``--config``'s ``bench`` section (defaults without it); flags override them.
``--slo`` replaces the latency limits (options not named keep their defaults). The age check's
date is ``--as-of``, else ``bench.as_of``, else the ``ENGINEFIT_RUN_DATE`` environment variable
set by the calling shell; without any, the age check reports ``unknown`` (this module never reads
the clock). Workload facts (for fleet sizing and the production checks) come from
``--workload-facts`` or, when a workload is configured, from its shape and prefix stage outputs
(read exactly as the ``bench_*`` assets read them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from pipeline.bench.cost import COST_FORMULA, FLEET_FORMULA
from pipeline.bench.slo import BenchSettings, parse_as_of, parse_slo_spec
from pipeline.bench.stage import workload_facts
from pipeline.bench.validity import (
    CAPACITY_TEXT_COLUMNS,
    BenchAnalysis,
    analyse_bench,
    analysis_payload,
    load_workload_facts,
    markdown_table,
)
from pipeline.cli_common import add_config_argument, command_config
from pipeline.config import Config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.facts import WorkloadFacts

RUN_DATE_ENV = "ENGINEFIT_RUN_DATE"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="SLO capacity, cost per 1M tokens and validity of benchmark result files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="result files or folders")
    parser.add_argument("--manifest", type=Path, help="manifest YAML merged over sidecars")
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
    parser.add_argument("--workload-facts", type=Path, help="shape/workload_facts.json to join")
    parser.add_argument("--out", type=Path, help="also write JSON, Parquet and SVG plots here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run_bench)


def resolve_settings(args: argparse.Namespace, config: Config) -> BenchSettings:
    """The configuration's ``bench`` section, then command-line overrides."""
    settings = config.bench
    changes: dict[str, Any] = {}
    if args.slo is not None:
        changes["slo"] = parse_slo_spec(args.slo)
    if args.gpu_hour_usd is not None:
        if not args.gpu_hour_usd >= 0:
            raise ConfigError(f"--gpu-hour-usd: must be ≥ 0, got {args.gpu_hour_usd}")
        changes["prices"] = dataclasses.replace(settings.prices, override=args.gpu_hour_usd)
    if args.interpolate:
        changes["interpolate"] = True
    if args.manifest is not None:
        changes["manifest"] = args.manifest
    if args.as_of is not None:
        changes["as_of"] = parse_as_of(args.as_of, "--as-of")
    elif settings.as_of is None and os.environ.get(RUN_DATE_ENV):
        changes["as_of"] = parse_as_of(os.environ[RUN_DATE_ENV], RUN_DATE_ENV)
    return dataclasses.replace(settings, **changes)


def write_outputs(analysis: BenchAnalysis, out: Path) -> list[Path]:
    """JSON payload, Parquet tables and SVG plots into ``out`` (atomic writes)."""
    from pipeline.bench.charts import cost_svg, latency_vs_load_svg
    from pipeline.store import write_bytes_atomic, write_json_atomic, write_parquet_atomic

    written = {
        "bench_analysis.json": None,
        "slo_points.parquet": analysis.evaluated,
        "slo_capacity.parquet": analysis.capacity,
        "fleet.parquet": analysis.fleet,
        "validity_findings.parquet": analysis.findings,
    }
    paths: list[Path] = []
    for name, frame in written.items():
        target = out / name
        if frame is None:
            write_json_atomic(target, analysis_payload(analysis))
        else:
            write_parquet_atomic(frame, target)
        paths.append(target)
    latency = out / "latency_vs_load.svg"
    write_bytes_atomic(latency, latency_vs_load_svg(analysis.evaluated, analysis.settings.slo))
    cost = out / "cost_per_1m_at_slo.svg"
    write_bytes_atomic(cost, cost_svg(analysis.capacity, comparable=analysis.comparable))
    return [*paths, latency, cost]


def render_text(analysis: BenchAnalysis) -> str:
    """Human-readable summary: SLO, capacity/cost table, fleet, findings that are not ok."""
    lines = [
        f"SLO: {analysis.settings.slo.describe()}",
        f"as of: {analysis.as_of.isoformat() if analysis.as_of else 'not given (age unknown)'}",
        f"{COST_FORMULA}",
        "",
        "## Capacity at the SLO and cost",
        markdown_table(analysis.capacity, CAPACITY_TEXT_COLUMNS),
    ]
    if analysis.fleet.height:
        lines += [
            "",
            f"## Fleet ({FLEET_FORMULA})",
            markdown_table(analysis.fleet, analysis.fleet.columns),
        ]
    findings = analysis.findings.filter(analysis.findings["status"] != "ok")
    lines += ["", "## Validity findings (flag / unknown)"]
    lines.append(markdown_table(findings, ["candidate", "check", "status", "message"]))
    if analysis.notes:
        lines += ["", "## Notes", *(f"- {note}" for note in analysis.notes)]
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> int:
    from pipeline.bench import read_bench_files

    config = command_config(args)
    settings = resolve_settings(args, config)
    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise InputFormatError(f"{path}: no such benchmark result file or folder")
    result = read_bench_files(paths, manifest=settings.manifest)
    facts: WorkloadFacts | None
    if args.workload_facts is not None:
        facts = load_workload_facts(args.workload_facts)
    elif config.workload is not None:
        facts, _ = workload_facts(config.layout())
    else:
        facts = None
    analysis = analyse_bench(
        result.load_points, settings, facts, notes=result.notes, per_request=result.per_request
    )
    if args.out is not None:
        write_outputs(analysis, args.out)
    if args.json:
        print(json.dumps(analysis_payload(analysis), indent=2, sort_keys=True, default=str))
    else:
        print(render_text(analysis))
    return 0
