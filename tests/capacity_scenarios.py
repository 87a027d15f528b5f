"""Scenarios shared by the capacity tests, each built once per test process (``lru_cache``):
benchmark sweeps written by the independent simulator (``batching_server_sim``) as real vLLM
result files, read back through the product's bench readers, and the simulator's own answers.

Request mixes: short = prompts 100-300 tokens, answers 100-300; long = prompts 3,000-5,000,
answers 100-300. The SLO is the project default (p95 TTFT 1 s, p99 per-gap ITL 60 ms); the
deployment runs a 1,024-token step budget and at most 256 sequences (both sides know them: it
is the team's own engine configuration).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from perf.capacity import LLAMA_8B
from pipeline.bench.readers import read_bench_files
from pipeline.bench.schema import BenchReadResult
from pipeline.capacity.compute import WorkloadRequests
from pipeline.capacity.fit import deployment_of, fit_serving_model
from pipeline.capacity.result import ServingModel, Slo
from pipeline.config import default_config
from pipeline.unknown import Unknown
from tests import batching_server_sim as sim

SERVER = sim.GpuServer()
SLO = Slo(ttft_p95_ms=1000.0, itl_p99_ms=60.0)
CONFIG = default_config().capacity.replace(token_budget=1024, max_batch=256, sample_requests=2000)
KV_TOKENS = 450_000
PRICE = 2.5
SHORT = ((100, 300), (100, 300))
LONG = ((3000, 5000), (100, 300))
# Rates below each mix's capacity (about 52 req/s short, 3.9 req/s long on SERVER).
RATES = {"short": [5.0, 15.0, 25.0, 35.0, 45.0], "long": [0.4, 1.2, 2.0, 2.8, 3.5]}
MIXES = {"short": SHORT, "long": LONG}
BENCH_REQUESTS = 600
TRUTH_REQUESTS = 2000

_ROOT = Path(tempfile.mkdtemp(prefix="enginefit-capacity-"))
atexit.register(shutil.rmtree, _ROOT, True)


@cache
def sweep(mix: str, per_request: bool = True, gpu_type: str = "H100-80GB") -> BenchReadResult:
    """The simulator's sweep of one mix at ``RATES[mix]``, read by ``read_bench_files``."""
    folder = _ROOT / f"{mix}-{per_request}-{gpu_type}"
    prompt, output = sim.mix(BENCH_REQUESTS, *MIXES[mix], seed=8)
    sim.write_sweep(SERVER, folder, RATES[mix], prompt, output, gpu_type=gpu_type, price=PRICE)
    if not per_request:
        for path in folder.glob("*.json"):
            sim.strip_per_request(path)
    return read_bench_files(folder)


@cache
def fitted(
    mix: str, per_request: bool = True, gpu_type: str = "H100-80GB"
) -> ServingModel | Unknown:
    read = sweep(mix, per_request, gpu_type)
    points = read.load_points
    return fit_serving_model(
        points,
        read.per_request,
        deployment_of(points.row(0, named=True)),
        config=CONFIG,
        model_shape=LLAMA_8B,
    )


def workload(
    mix: str, cached_share: float = 0.0, n: int = 20_000, seed: int = 5
) -> WorkloadRequests:
    prompt, output = sim.mix(n, *MIXES[mix], seed=seed)
    cached = np.floor(prompt * cached_share).astype(np.int64)
    return WorkloadRequests(prompt=prompt, output=output, cached=cached)


@cache
def truth(mix: str, cached_share: float = 0.0) -> tuple[float, sim.ServedRun]:
    """The simulator's own capacity at the SLO for a workload of this mix (its own draw)."""
    prompt, output = sim.mix(TRUTH_REQUESTS, *MIXES[mix], seed=99)
    cached = np.floor(prompt * cached_share).astype(np.int64)
    start = 0.5 if mix == "long" else 5.0
    return sim.find_capacity(
        SERVER, prompt, output, cached, SLO.ttft_p95_ms, SLO.itl_p99_ms, start=start
    )


#: Requests the simulator's own search replays for a bursty truth (its p95 TTFT under Gamma
#: CV 2 arrivals needs more than the Poisson truth's 2,000 to settle), and the seeds averaged.
BURSTY_TRUTH_REQUESTS = 8000
BURSTY_TRUTH_SEEDS = (7, 8)


def bursty_workload(mix: str, cv: float, cached_share: float, n: int = 20_000) -> WorkloadRequests:
    """A workload of this mix whose requests arrive with Gamma gaps of ``cv`` (its own trace:
    arrival times in seconds) and each carry their own cached tokens averaging
    ``cached_share`` (:func:`batching_server_sim.cache_hits`)."""
    prompt, output = sim.mix(n, *MIXES[mix], seed=5)
    gaps = np.random.default_rng(4).gamma(1.0 / cv**2, cv**2 / 10.0, n)
    arrival = np.cumsum(gaps) - gaps[0]
    cached = sim.cache_hits(prompt, cached_share, seed=6)
    return WorkloadRequests(prompt=prompt, output=output, cached=cached, arrival_s=arrival)


@cache
def bursty_truth(mix: str, cv: float, cached_share: float) -> float:
    """The simulator's own capacity for Gamma-``cv`` arrivals and per-request cache hits
    averaging ``cached_share`` (its own draw), averaged over ``BURSTY_TRUTH_SEEDS``."""
    prompt, output = sim.mix(BURSTY_TRUTH_REQUESTS, *MIXES[mix], seed=99)
    cached = sim.cache_hits(prompt, cached_share, seed=98)
    start = 0.5 if mix == "long" else 5.0
    rates = [
        sim.find_capacity(
            SERVER,
            prompt,
            output,
            cached,
            SLO.ttft_p95_ms,
            SLO.itl_p99_ms,
            start=start,
            cv=cv,
            seed=seed,
        )[0]
        for seed in BURSTY_TRUTH_SEEDS
    ]
    return float(np.mean(rates))


def truth_costs(mix: str, cached_share: float = 0.0) -> tuple[float, float]:
    """(all-in $ per 1M output tokens, decode-share $ per 1M output tokens) at the simulator's
    own capacity: the replica's hour divided by the output tokens it serves there, the second
    only for the share of the GPU's time that was not prefill or reading cached context."""
    rate, run = truth(mix, cached_share)
    output_per_hour = rate * float(run.output.mean()) * 3600.0
    decode = 1.0 - (run.busy_prefill_ms + run.busy_cached_kv_ms) / run.busy_total_ms
    return PRICE / output_per_hour * 1e6, PRICE * decode / output_per_hour * 1e6
