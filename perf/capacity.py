"""Capacity core speed: fit one deployment's serving model and carry it to a large workload.

Run from the repository root: ``.venv/bin/python -m perf.capacity [--requests N]
[--sample N] [--repeats K]``.

The benchmark is the tests' independent simulator (``tests/batching_server_sim.py``) at five
rates of one short mix (600 requests each), written as vLLM ``bench serve`` files and read by
``pipeline.bench.readers.read_bench_files``. The workload is ``--requests`` requests (default 1,000,000)
with 3,000-5,000-token prompts and 30 % of prompt tokens cached, as the ingest stage's columns.
Timed (best of ``--repeats``, after one warm-up that compiles or loads the numba kernels):
reading the files, the fit (the sweep's manifest states no limits, so the fit checks the
catalog's prefill budget against the data: its costliest path), the workload arrays from the
frame, and the transfer (sampling, the capacity searches for the value, its band and the
budgets the data allow, the binding limit, the cost). Target: fit + transfer < 5 s per
candidate.

Then the stage as a whole command: ``enginefit capacity --config`` in its own process (start,
imports, read the bench, ingest, shape and simulation outputs, fit, transfer, write, print) on
the bundled sweep (``bench-results/``, one deployment) and a ``perf/workload.py`` trace of
``--requests`` requests (long profile, written as an Azure CSV: lengths and times only, so the
cached share is 0), after ingest, shape, simulate (one scenario) and bench ran untimed; the
SLO is loosened to p95 TTFT 10 s so the long prompts have a capacity. ``--stage-requests 0``
skips it. Prints figures; asserts nothing.
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
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import ServingModel, Slo
from pipeline.capacity.stage import deployment_limits
from pipeline.config import default_config
from pipeline.decision.catalog import load_catalog
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
    frame = pl.DataFrame(
        {
            "prompt_tokens": prompts,
            "output_tokens": rng.integers(100, 301, args.requests),
            "cached_tokens": (prompts * 0.3).astype(np.int64),
        }
    )
    arrays_s, mix = best_of(
        args.repeats, lambda: workload_requests(frame, cached_column="cached_tokens")
    )

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
        )

    transfer_s, candidate = best_of(args.repeats, transfer)
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
        f"transfer: {transfer_s:.3f} s (sample {min(args.sample, args.requests):,}; capacity "
        f"{capacity if isinstance(capacity, Unknown) else f'{capacity:.3f}'} req/s, band {band})"
    )
    total = fit_s + arrays_s + transfer_s
    print(f"fit + transfer per candidate: {total:.3f} s (target < 5 s)")
    if args.stage_requests > 0:
        stage_command(args.stage_requests, args.repeats)
    return 0


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
