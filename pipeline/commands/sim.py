"""``enginefit simulate`` and ``enginefit curve``: prefix-cache replay from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

import polars as pl

from pipeline.commands.common import add_config_argument, command_config
from pipeline.commands.ingest import FORMAT_HELP, adhoc_requests
from pipeline.config import Config
from pipeline.errors import ConfigError
from pipeline.ingest.readers import FORMAT_NAMES
from pipeline.present.text import share
from pipeline.settings import from_flags, with_flags
from pipeline.sim import stage
from pipeline.sim.blocks import SimInputs, sim_input
from pipeline.sim.config import (
    MAX_REPLICAS,
    ROUTINGS,
    Scenario,
    ScenarioFlags,
    SimConfig,
)
from pipeline.sim.curve import CURVE_POINTS, capacity_curve, require_single_pass
from pipeline.sim.present import (
    curve_sampling_note,
    curves_table,
    scenario_warnings,
    scenarios_table,
)
from pipeline.sim.replay import simulate, summarise
from pipeline.sim.result import curves_frame

# What one ad-hoc scenario is when a flag is not given (the configured grid never reads these).
ADHOC_REPLICAS = 1
ADHOC_ROUTING = "round-robin"
EXACT_SAMPLE_RATE = 1.0

# Numbers and names are taken as text and checked by pipeline.sim.config.ScenarioFlags (or the
# simulation section), so a bad one is a one-line error naming the flag (argparse's own would
# print the usage too).


def _common(parser: argparse.ArgumentParser, *, trace_required: bool) -> None:
    parser.add_argument(
        "trace",
        metavar="TRACE",
        nargs=None if trace_required else "?",
        help="raw trace (any format) or canonical Parquet"
        + ("" if trace_required else " (none: the configured workload and grid)"),
    )
    parser.add_argument(
        "--block-size",
        metavar="N",
        default=None,
        help="cache block size in tokens: the trace's stored block size or a multiple of it",
    )
    parser.add_argument(
        "--replicas",
        metavar="N",
        default=None,
        help=f"replicas, each with its own cache (default {ADHOC_REPLICAS}, at most "
        f"{MAX_REPLICAS})",
    )
    parser.add_argument(
        "--routing",
        metavar="NAME",
        default=None,
        help=f"{', '.join(ROUTINGS)} (default {ADHOC_ROUTING})",
    )
    parser.add_argument(
        "--format", default="auto", choices=["auto", *FORMAT_NAMES], help=FORMAT_HELP
    )
    parser.add_argument(
        "--tenant-isolation", action="store_true", help="one cache namespace per tenant"
    )
    parser.add_argument("--seed", metavar="N", default=None, help="seed of the random routing")
    parser.add_argument(
        "--margin",
        metavar="X",
        default=None,
        help="bounded-affinity load margin (default: the config's)",
    )
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="replay traffic through per-replica prefix caches",
        description="Replay a workload through R replicas' vLLM-style prefix caches under a "
        "routing policy. Without TRACE: every scenario and curve of the configured grid, written "
        "to the workload folder (what the simulation assets do). With TRACE: one scenario "
        "(--block-size and --cache-tokens required), printed: prompt tokens, hit tokens, hit "
        "ratio and per-replica load.",
    )
    _common(sim, trace_required=False)
    sim.add_argument(
        "--cache-tokens",
        metavar="N",
        default=None,
        help="prefix-cache capacity per replica (tokens)",
    )
    sim.add_argument(
        "--request-lifetime",
        metavar="NAME",
        default=None,
        help="durations: blocks pinned until each request finishes; instant: released at "
        "arrival (default: the config's simulation.request_lifetime)",
    )
    sim.set_defaults(func=run_simulate)
    curve = subparsers.add_parser(
        "curve",
        help="hit ratio at every cache capacity in one pass",
        description="Hit ratio versus per-replica cache capacity from one LRU stack-distance "
        "pass (exact); routings that read cache state (cache-aware) are refused.",
    )
    _common(curve, trace_required=True)
    curve.add_argument("--points", metavar="N", default=None, help="log-spaced points to print")
    curve.add_argument(
        "--sample-rate",
        metavar="X",
        default=None,
        help="SHARDS sampling rate in (0, 1]; 1 = exact (default)",
    )
    curve.set_defaults(func=run_curve)


def _scenario_flags(args: argparse.Namespace) -> ScenarioFlags:
    """The scenario's numbers as typed, parsed and bounded (before any trace is read)."""
    if args.block_size is None:
        raise ConfigError("--block-size is required with TRACE (the cache block size in tokens)")
    given = {
        "block_size": ("--block-size", args.block_size),
        "replicas": ("--replicas", args.replicas),
        "routing": ("--routing", args.routing),
        "cache_tokens": ("--cache-tokens", getattr(args, "cache_tokens", None)),
        "points": ("--points", getattr(args, "points", None)),
        "sample_rate": ("--sample-rate", getattr(args, "sample_rate", None)),
        "random_seed": ("--seed", args.seed),
        "bounded_affinity_margin": ("--margin", args.margin),
    }
    defaults = {
        "replicas": ("--replicas", ADHOC_REPLICAS),
        "routing": ("--routing", ADHOC_ROUTING),
        "sample_rate": ("--sample-rate", EXACT_SAMPLE_RATE),
    }
    flags = {**defaults, **{k: v for k, v in given.items() if v[1] is not None}}
    return from_flags(ScenarioFlags, flags)


def _adhoc(
    args: argparse.Namespace, config: Config, numbers: ScenarioFlags
) -> tuple[SimInputs, SimConfig]:
    """The trace named on the command line and the simulation settings with the flags'
    overrides (``numbers``: the flags already validated, before the trace is read)."""
    flags: dict[str, tuple[str, Any]] = {}
    if numbers.random_seed is not None:
        flags["random_seed"] = ("--seed", numbers.random_seed)
    if numbers.bounded_affinity_margin is not None:
        flags["bounded_affinity_margin"] = ("--margin", numbers.bounded_affinity_margin)
    if args.tenant_isolation:
        flags["tenant_isolation"] = ("--tenant-isolation", True)
    if getattr(args, "request_lifetime", None) is not None:
        flags["request_lifetime"] = ("--request-lifetime", args.request_lifetime)
    settings = with_flags(config.simulation, flags)
    read_args = argparse.Namespace(
        **{**vars(args), "paths": [args.trace], "block_size": numbers.block_size}
    )
    requests = adhoc_requests(read_args, config)
    inp = sim_input(requests, latency_model=settings.latency(config.shape.latency))
    return inp, settings


def _print(payload: Any, as_json: bool, text: str) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True) if as_json else text)


def run_simulate(args: argparse.Namespace) -> int:
    config = command_config(args, paths=[args.trace] if args.trace else [])
    if args.trace is None:
        return _run_configured(args, config)
    numbers = _scenario_flags(args)
    if numbers.cache_tokens is None:
        raise ConfigError("--cache-tokens is required with TRACE (cache capacity per replica)")
    inp, settings = _adhoc(args, config, numbers)
    scenario = Scenario(
        numbers.block_size,
        numbers.replicas,
        numbers.cache_tokens,
        numbers.routing,
        settings.tenant_isolation,
    )
    run = simulate(inp, scenario, settings)
    out = summarise(inp, run)
    lines = [
        f"{out['requests']:,} requests, {scenario.replicas} replica(s), {scenario.routing}, "
        f"{scenario.cache_tokens:,} cache tokens per replica, block size {scenario.block_size}, "
        f"request lifetime {run.request_lifetime}",
    ]
    if out["hit_unknown_reason"] is not None:
        lines.append(
            f"prompt tokens {out['prompt_tokens']:,}; hit ratio unknown: "
            f"{out['hit_unknown_reason']}"
        )
    else:
        covered = (
            f" of the {out['content_prompt_tokens']:,} prompt tokens with content"
            if out["content_share"] < 1
            else ""
        )
        lines += [
            f"prompt tokens {out['prompt_tokens']:,}; hit {out['hit_tokens']:,} "
            f"({out['hit_ratio']:.2%}{covered}); prefill computed {out['prefill_tokens']:,}",
            "hit ratio with blocks released at arrival (instant): "
            f"{share(out['hit_ratio_instant'], 2)}",
        ]
    lines.append(
        f"imbalance (max/mean): requests {out['request_imbalance']:.3f}, tokens "
        f"{out['token_imbalance']:.3f}; spills {out['spills']:,}"
    )
    lines += [
        f"  replica {row['replica']}: {row['requests']:,} requests, {row['prompt_tokens']:,} "
        f"prompt tokens, hit ratio {share(row['hit_ratio'], 2)}"
        for row in out["per_replica"]
    ]
    lines += [f"warning: {w}" for w in out["warnings"]]
    _print(out, args.json, "\n".join(lines))
    return 0


def _run_configured(args: argparse.Namespace, config: Config) -> int:
    """The configured grid and curves, written as the simulation assets write them."""
    given = [
        flag
        for flag, value in (
            ("--block-size", args.block_size),
            ("--replicas", args.replicas),
            ("--routing", args.routing),
            ("--cache-tokens", args.cache_tokens),
            ("--seed", args.seed),
            ("--margin", args.margin),
            ("--request-lifetime", args.request_lifetime),
        )
        if value is not None
    ] + (["--tenant-isolation"] if args.tenant_isolation else [])
    if given:
        raise ConfigError(
            f"{', '.join(given)} apply to one TRACE scenario; the configured grid is set in "
            "the simulation section of the configuration"
        )
    layout = config.layout()
    settings = config.simulation
    latency = settings.latency(config.shape.latency)
    inputs = stage.scenario_inputs(layout, settings, latency)
    curved = stage.curves(layout, settings, latency)
    result = stage.run(inputs, settings, curved.curves)
    stage.write(result, layout)
    points = result.curve_points
    if args.json:
        _print({"scenarios": [s.to_json() for s in result.summaries], "curves": points}, True, "")
    else:
        scenarios = pl.read_parquet(layout.simulation.scenarios)
        _print(
            None,
            False,
            "\n\n".join(
                [
                    f"## Scenarios ({scenarios.height})",
                    scenarios_table(scenarios),
                    # what the table cannot say: shed requests, pinned blocks, estimates
                    *filter(None, ["\n".join(scenario_warnings(scenarios))]),
                    "## Capacity curves (instant lifetime)",
                    curves_table(points),
                    # said only of sampled curves, as in the document
                    *filter(None, [curve_sampling_note(curves_frame(result.curves))]),
                    *filter(None, [stage.resume_note(inputs), curved.resumed]),
                    f"wrote {layout.simulation.dir}",
                ]
            ),
        )
    return 0


def run_curve(args: argparse.Namespace) -> int:
    config = command_config(args, paths=[args.trace])
    numbers = _scenario_flags(args)
    require_single_pass(numbers.routing, numbers.replicas)
    inp, settings = _adhoc(args, config, numbers)
    curve = capacity_curve(
        inp,
        settings,
        block_size=numbers.block_size,
        replicas=numbers.replicas,
        routing=numbers.routing,
        sample_rate=numbers.sample_rate or EXACT_SAMPLE_RATE,
    )
    out = curve.as_dict(numbers.points or CURVE_POINTS)
    heading = (
        f"{inp.n:,} requests, {curve.replicas} replica(s), {curve.routing}, block size "
        f"{curve.block_size}: "
    )
    if curve.unknown_reason is not None:
        lines = [heading + f"hit ratio unknown: {curve.unknown_reason}"]
    else:
        lines = [
            heading + f"max hit ratio {out['max_hit_ratio']:.2%} from "
            f"{curve.saturation_cache_tokens:,} cache tokens per replica",
        ]
        lines += [
            f"  {p['cache_tokens']:>14,} tokens: hit ratio {p['hit_ratio']:.2%}"
            for p in out["points"]
        ]
    partial = curve.coverage.partial_warning(inp.n)
    lines += [f"warning: {partial}"] if partial else []
    _print(out, args.json, "\n".join(lines))
    return 0
