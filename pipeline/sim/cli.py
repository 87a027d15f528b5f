"""``enginefit simulate`` and ``enginefit curve``: prefix-cache replay from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.cli_common import add_config_argument, adhoc_requests, command_config
from pipeline.config import Config
from pipeline.readers import FORMAT_NAMES
from pipeline.sim.blocks import SimInput, sim_input
from pipeline.sim.config import (
    REQUEST_LIFETIMES,
    ROUTINGS,
    CacheAwareConfig,
    Scenario,
    SimulationConfig,
)
from pipeline.sim.curve import capacity_curve
from pipeline.sim.replay import simulate, summarise


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace", metavar="TRACE", help="raw trace (any format) or canonical Parquet"
    )
    parser.add_argument(
        "--block-size",
        type=int,
        required=True,
        help="cache block size in tokens: the trace's stored block size or a multiple of it",
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas, each with its own cache")
    parser.add_argument("--routing", default="round-robin", choices=list(ROUTINGS))
    parser.add_argument("--format", default="auto", choices=["auto", *FORMAT_NAMES])
    parser.add_argument(
        "--tenant-isolation", action="store_true", help="one cache namespace per tenant"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the random routing")
    parser.add_argument(
        "--margin", type=float, default=None, help="bounded-affinity load margin (default 0.2)"
    )
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="replay a trace through per-replica prefix caches",
        description="Replay a workload through R replicas' vLLM-style prefix caches under a "
        "routing policy; print prompt tokens, hit tokens, hit ratio and per-replica load.",
    )
    _common(sim)
    sim.add_argument(
        "--cache-tokens", type=int, required=True, help="prefix-cache capacity per replica (tokens)"
    )
    sim.add_argument(
        "--request-lifetime",
        choices=list(REQUEST_LIFETIMES),
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
    _common(curve)
    curve.add_argument("--points", type=int, default=None, help="log-spaced points to print")
    curve.add_argument(
        "--sample-rate",
        type=float,
        default=1.0,
        help="SHARDS sampling rate in (0, 1]; 1 = exact (default)",
    )
    curve.set_defaults(func=run_curve)


def _load(args: argparse.Namespace, config: Config, sim: SimulationConfig) -> SimInput:
    args.paths = [args.trace]
    return sim_input(adhoc_requests(args, config), latency_model=sim.latency_model)


def _print(payload: dict[str, Any], as_json: bool, text: str) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True) if as_json else text)


def run_simulate(args: argparse.Namespace) -> int:
    config = command_config(args, paths=[args.trace])
    sim = config.simulation
    inp = _load(args, config, sim)
    scenario = Scenario(
        args.block_size, args.replicas, args.cache_tokens, args.routing, args.tenant_isolation
    )
    run = simulate(
        inp,
        scenario,
        seed=sim.random_seed if args.seed is None else args.seed,
        margin=sim.bounded_affinity_margin if args.margin is None else args.margin,
        cache_aware=sim.cache_aware or CacheAwareConfig(),
        request_lifetime=args.request_lifetime or sim.request_lifetime,
        replica_slots=sim.replica_slots,
    )
    out = summarise(inp, run, pinned_warn_share=sim.pinned_warn_share)
    lines = [
        f"{out['requests']:,} requests, {scenario.replicas} replica(s), {scenario.routing}, "
        f"{scenario.cache_tokens:,} cache tokens per replica, block size {scenario.block_size}, "
        f"request lifetime {run.request_lifetime}",
        f"prompt tokens {out['prompt_tokens']:,}; hit {out['hit_tokens']:,} "
        f"({out['hit_ratio']:.2%}); prefill computed {out['prefill_tokens']:,}",
        f"hit ratio with blocks released at arrival (instant): {out['hit_ratio_instant']:.2%}",
        f"imbalance (max/mean): requests {out['request_imbalance']:.3f}, tokens "
        f"{out['token_imbalance']:.3f}; spills {out['spills']:,}",
    ]
    lines += [
        f"  replica {row['replica']}: {row['requests']:,} requests, {row['prompt_tokens']:,} "
        f"prompt tokens, hit ratio {row['hit_ratio']:.2%}"
        for row in out["per_replica"]
    ]
    lines += [f"warning: {w}" for w in out["warnings"]]
    _print(out, args.json, "\n".join(lines))
    return 0


def run_curve(args: argparse.Namespace) -> int:
    config = command_config(args, paths=[args.trace])
    sim = config.simulation
    inp = _load(args, config, sim)
    curve = capacity_curve(
        inp,
        block_size=args.block_size,
        replicas=args.replicas,
        routing=args.routing,
        tenant_isolation=args.tenant_isolation,
        seed=sim.random_seed if args.seed is None else args.seed,
        margin=sim.bounded_affinity_margin if args.margin is None else args.margin,
        sample_rate=args.sample_rate,
        replica_slots=sim.replica_slots,
    )
    out = curve.as_dict(args.points or sim.curve_points)
    lines = [
        f"{inp.n:,} requests, {curve.replicas} replica(s), {curve.routing}, block size "
        f"{curve.block_size}: max hit ratio {out['max_hit_ratio']:.2%} from "
        f"{curve.saturation_cache_tokens:,} cache tokens per replica",
    ]
    lines += [
        f"  {p['cache_tokens']:>14,} tokens: hit ratio {p['hit_ratio']:.2%}" for p in out["points"]
    ]
    _print(out, args.json, "\n".join(lines))
    return 0
