"""Capacity core speed: fit one deployment's serving model and carry it to a large workload,
with the traffic's own arrivals and the fleet's own cache.

Run from the repository root: ``.venv/bin/python -m perf.capacity [--requests N]
[--sample N] [--repeats K] [--stage-requests N] [--fleet-requests N]``.

The benchmark is the tests' independent simulator (``tests/batching_server_sim.py``) at five
rates of one short mix (600 requests each), written as vLLM ``bench serve`` files and read by
``pipeline.bench.readers.read_bench_files``; the sweep's manifest states no limits, so the fit
checks the catalog's prefill budget against the data (its costliest path).

1. **Transfer.** The workload is ``--requests`` requests (default 1,000,000) with
   3,000-5,000-token prompts, 30 % of prompt tokens cached and Gamma CV 2 arrivals, as the
   ingest stage's columns. Timed (best of ``--repeats``, after one warm-up that compiles or
   loads the numba kernels): reading the files, the fit, the workload arrays from the frame, and
   the transfer with the trace's own arrivals (sampling in contiguous runs, the capacity search,
   its band, the budgets the data allow, the binding limit, the five sensitivity searches, the
   cost), CPU seconds beside wall.
2. **The fleet's own cache.** ``--fleet-requests`` requests (default 1,000,000) of
   ``perf.workload``'s long profile (multi-turn conversations on shared system prompts,
   512-token blocks) flattened for the replay kernels as the simulation stage does, its
   scenarios at 4 replicas (round-robin and cache-aware, the simulation stage's work, timed
   apart), then three candidates carried with the fleet fixed point at a loose SLO (p95 TTFT
   10 s), each with the sweep's model fitted with the server's limits stated (1,024-token
   budget, 256 requests: the 200-token sweep cannot pin the budget the long prompts depend on): the first on 1×H100 replays its fleet's caches, the second (another engine on
   1×H100: the same pool) reuses them, the third (2×H100: another pool) replays its own. Each
   candidate's seconds (wall and CPU) and replays are printed: the target is < 5 s a candidate.
3. **The stage as a whole command**: ``enginefit capacity --config`` in its own process (start,
   imports, read the bench, ingest, shape and simulation outputs, flatten the trace for the
   replays, fit, transfer, write, print) on the bundled sweep (``bench-results/``, one
   deployment) and a ``perf/workload.py`` trace of ``--stage-requests`` requests (long profile,
   written as an Azure CSV: lengths and times only, so its own arrivals and no cache), after
   ingest, shape, simulate (one scenario) and bench ran untimed; the SLO is loosened to p95
   TTFT 10 s so the long prompts have a capacity. ``--stage-requests 0`` skips it.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl

from pipeline.bench.readers import read_bench_files
from pipeline.capacity.compute import carry_to_workload, workload_requests
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.capacity.fleet_cache import CacheReplays, deployment_kv_tokens
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import Arrivals, ServingModel, Slo
from pipeline.capacity.search import sample_requests
from pipeline.capacity.stage import deployment_limits
from pipeline.config import default_config
from pipeline.decision.catalog import load_catalog
from pipeline.decision.config import KvCacheSizing
from pipeline.sim.blocks import sim_input
from pipeline.sim.compute import scenario_summary
from pipeline.sim.config import Scenario
from pipeline.unknown import Unknown

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
# Llama-3.1-8B in BF16, the model of the bundled sample (also the tests' capacity scenarios).
LLAMA_8B = ModelShape(
    params_billion=8.03,
    weight_bytes=2,
    layers=32,
    kv_heads=8,
    head_dim=128,
    kv_bytes=2,
    attention_heads=32,
)


def best_of(repeats: int, work: Callable[[], T]) -> tuple[float, T]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=default_config().capacity.sample_requests)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage-requests", type=int, default=1_000_000)
    parser.add_argument("--fleet-requests", type=int, default=1_000_000)
    args, _ = parser.parse_known_args(argv)
    if args.requests < 1 or args.repeats < 1:
        parser.error("--requests and --repeats must be positive")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import batching_server_sim as sim

    # No limits stated anywhere (the sweep's manifest has no engine_args): the fit checks the
    # catalog's budget against the data, the costlier path.
    config = default_config().capacity.replace(sample_requests=args.sample)
    slo = Slo(ttft_p95_ms=1000.0, itl_p99_ms=60.0)
    with tempfile.TemporaryDirectory() as folder:
        prompt, output = sim.mix(600, (100, 300), (100, 300), seed=8)
        sim.write_sweep(sim.GpuServer(), Path(folder), [5, 15, 25, 35, 45], prompt, output)
        read_s, read = best_of(args.repeats, lambda: read_bench_files(folder))
    points = read.load_points
    deployment = deployment_of(points.row(0, named=True))

    limits = deployment_limits(points, load_catalog(), config)

    def fit() -> ServingModel | Unknown:
        return fit_serving_model(
            points,
            read.per_request,
            deployment,
            config=config,
            limits=limits,
            model_shape=LLAMA_8B,
            measured_capacity=(45.0, None),
            slo=slo,
        )

    fit()  # compile / load the kernels once
    fit_s, model = best_of(args.repeats, fit)
    if isinstance(model, Unknown):
        print(f"fit failed: {model.reason}")
        return 1
    rng = np.random.default_rng(3)
    prompts = rng.integers(3000, 5001, args.requests)
    gaps_us = np.maximum(rng.gamma(0.25, 4.0 * 100_000, args.requests), 0).astype(np.int64)
    frame = pl.DataFrame(
        {
            "prompt_tokens": prompts,
            "output_tokens": rng.integers(100, 301, args.requests),
            "cached_tokens": (prompts * 0.3).astype(np.int64),
            "arrival": pl.Series(np.cumsum(gaps_us)).cast(pl.Datetime("us", "UTC")),
        }
    )
    arrays_s, mix = best_of(
        args.repeats, lambda: workload_requests(frame, cached_column="cached_tokens")
    )

    trace = Arrivals(kind="trace", cv=2.0, description="the generated trace's own arrivals")

    def transfer() -> object:
        return carry_to_workload(
            "vllm",
            model,
            mix,
            slo,
            kv_tokens=450_000,
            gpu_hour_usd=2.5,
            peak_rate_rps=20.0,
            mean_rate_rps=8.0,
            config=config,
            arrivals=trace,
        )

    cpu = time.process_time()
    transfer_s, candidate = best_of(args.repeats, transfer)
    transfer_cpu = (time.process_time() - cpu) / args.repeats
    print(f"benchmark: {points.height} vLLM result files read in {read_s:.3f} s")
    print(
        f"fit: {fit_s:.3f} s ({model.points_used} points, residual spread "
        f"{model.residual_spread:.1%}, prefill {model.prefill_split_basis}, context "
        f"{model.context_basis}, budget {model.limits.budget:,} "
        f"({model.limits.token_budget.source}), self-check "
        f"{'passed' if model.self_check.passed else 'failed'})"
    )
    print(f"workload arrays: {args.requests:,} requests in {arrays_s:.3f} s")
    capacity = getattr(candidate, "workload_capacity_rps", None)
    band = getattr(candidate, "workload_capacity_band_rps", None)
    print(
        f"transfer with the trace's arrivals, band and sensitivity: {transfer_s:.3f} s wall, "
        f"{transfer_cpu:.3f} s CPU on average (sample {min(args.sample, args.requests):,}; "
        f"capacity {capacity if isinstance(capacity, Unknown) else f'{capacity:.3f}'} req/s, "
        f"band {band})"
    )
    total = fit_s + arrays_s + transfer_s
    print(f"fit + transfer per candidate: {total:.3f} s (target < 5 s)")
    if args.fleet_requests > 0:
        # The server's own limits stated (as a manifest's engine_args would): the long
        # workload then has a capacity whatever the short sweep can tell of the budget.
        stated = config.replace(token_budget=1024, max_batch=256)
        fleet_model = fit_serving_model(
            points,
            read.per_request,
            deployment,
            config=stated,
            model_shape=LLAMA_8B,
            measured_capacity=(45.0, None),
            slo=slo,
        )
        if isinstance(fleet_model, Unknown):
            print(f"fit with the stated limits failed: {fleet_model.reason}")
            return 1
        fleet_cache(fleet_model, args.fleet_requests, stated)
    if args.stage_requests > 0:
        stage_command(args.stage_requests, args.repeats)
    return 0


def fleet_cache(model: ServingModel, requests: int, config: CapacityConfig) -> None:
    """Candidates carried with their fleets' own caches at ``requests`` requests (docstring 2)."""
    from perf import workload  # import here: only this part generates a content trace

    settings = default_config().simulation.replace(block_sizes=[512])
    start = time.perf_counter()
    frame = workload.canonical_frame(workload.conversations(workload.spec(requests)), 512)
    print(f"fleet cache: {requests:,} generated requests in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    inputs = sim_input(frame, latency_model=default_config().shape.latency)
    inputs.blocks(512)
    flattened = time.perf_counter() - start
    start = time.perf_counter()
    summaries = [
        scenario_summary(inputs, Scenario(512, 4, 450_000, routing), settings)
        for routing in ("round-robin", "cache-aware")
    ]
    print(
        f"  flattened for the replays in {flattened:.2f} s; the simulation stage's two scenarios "
        f"(4 replicas) in {time.perf_counter() - start:.2f} s (not the capacity stage's)"
    )
    replays = CacheReplays(inputs, settings, summaries)
    mix = workload_requests(frame.select("prompt_tokens", "output_tokens", "arrival"))
    arrivals = Arrivals(kind="trace", cv=1.0, description="the generated trace's own arrivals")
    sample = sample_requests(mix.prompt, mix.output, mix.cached, config, arrivals, mix.arrival_s)
    loose = Slo(ttft_p95_ms=10_000.0, itl_p99_ms=60.0)
    peak = requests / float(mix.arrival_s[-1]) * 1.5 if mix.arrival_s is not None else 20.0
    import yaml  # import here: only the fleet and whole-command parts read the bundled file

    bundled = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    kv_cache = KvCacheSizing.model_validate(bundled["requirements"]["kv_cache"])
    served = default_config().requirements.replace(kv_cache=kv_cache).served_model()
    for name, gpus in (("first, 1×H100", 1), ("second, 1×H100", 1), ("third, 2×H100", 2)):
        kv, source = deployment_kv_tokens(
            model.limits, served.shape, served.memory, "H100", gpus, (450_000, "default")
        )
        before, cpu = replays.replays, time.process_time()
        start = time.perf_counter()
        found = carry_to_workload(
            name,
            model,
            mix,
            loose,
            kv_tokens=kv,
            kv_source=source,
            gpu_hour_usd=2.5,
            peak_rate_rps=peak,
            mean_rate_rps=peak / 1.5,
            config=config,
            sample=sample,
            arrivals=arrivals,
            fleet_cache=replays,
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        fleet = found.fleet_cache
        passes = (
            " → ".join(
                f"{s.replicas} ({s.cached_share:.1%}: {s.capacity_rps if isinstance(s.capacity_rps, Unknown) else f'{s.capacity_rps:.3g}'} req/s)"
                for s in fleet.steps
            )
            if not isinstance(fleet, Unknown) and fleet is not None
            else "none"
        )
        print(
            f"  candidate {name}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
            f"{replays.replays - before} new replay(s) (passes {passes}; capacity "
            f"{found.workload_capacity_rps if isinstance(found.workload_capacity_rps, Unknown) else f'{found.workload_capacity_rps:.3g} req/s'}"
            f"; cached {fleet.cached_share if fleet is not None and not isinstance(fleet, Unknown) else 0:.1%}"
            f"; binds {found.binding if isinstance(found.binding, Unknown) else found.binding.limit})"
        )


def stage_configuration(root: Path, trace: Path, name: str, **sections: Any) -> Path:
    """``root/enginefit.yaml`` for a generated Azure-CSV trace: outputs under ``root``, a
    one-scenario simulation grid, the bundled sweep and prices at a loose SLO (p95 TTFT 10 s,
    so the long generated prompts have a capacity), plus ``sections`` as given."""
    import yaml  # import here: only the whole-command parts write a configuration

    bundled = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    path = root / "enginefit.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "workload": {"name": name, "traces": [{"path": str(trace), "format": "azure"}]},
                "paths": {"data_dir": str(root / "data"), "reports_dir": str(root / "r")},
                "simulation": {
                    "replicas": [1],
                    "cache_tokens": [450000],
                    "routings": ["round-robin"],
                },
                "bench": {
                    "results": [str(REPO / "bench-results")],
                    "prices": bundled["bench"]["prices"],
                    "slo": {"ttft_p95_ms": 10000, "itl_p99_ms": 60},
                },
                **sections,
            }
        )
    )
    return path


def stage_command(requests: int, repeats: int) -> None:
    """``enginefit capacity`` as a whole command on a generated workload (module docstring)."""
    import yaml  # import here: only this part writes a configuration

    from perf import workload  # import here: the stage part alone generates a trace
    from perf.ingest import run_enginefit  # import here: likewise, the command launcher

    bundled = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        trace = root / "trace.csv"
        workload.write_azure_csv(workload.conversations(workload.spec(requests)), trace)
        config = stage_configuration(
            root,
            trace,
            "perf-capacity",
            requirements={"kv_cache": bundled["requirements"]["kv_cache"]},
        )
        for command in ("ingest", "shape", "simulate", "bench"):
            run_enginefit([command, "--config", str(config)], root)
        timings = [
            run_enginefit(["capacity", "--config", str(config)], root) for _ in range(repeats)
        ]
        wall, rss = min(timings)
        print(
            f"enginefit capacity, whole command, {requests:,}-request workload, 1 candidate: "
            f"{wall:.2f} s (best of {repeats}), peak RSS {rss:,.0f} MiB"
        )


if __name__ == "__main__":
    raise SystemExit(main())
