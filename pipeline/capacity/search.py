"""Capacity at the SLO by simulation: the largest Poisson arrival rate a replica serves while
meeting the SLO and keeping up.

The workload's requests are sampled once (``CapacityConfig.sample_requests``, fixed seed) and
given unit-rate exponential inter-arrival gaps once; a rate λ divides those gaps by λ. Every
rate tried therefore replays the same requests in the same order (common random numbers), so
pass/fail is (nearly) monotone in λ and bisection converges on one edge instead of chasing
sampling noise.

A rate passes when, over the requests after the warm-up share:

* p95 TTFT ≤ the limit, and p99 ITL (per-gap: every inter-token gap pooled; per-request:
  TPOT = (e2e − TTFT) ÷ (output − 1)) ≤ the limit;
* the queue did not grow: the mean admission wait of the last quarter of requests is at most
  twice that of the second quarter plus 5 % of the TTFT limit. An overloaded server's wait grows
  with every request (docs/decision-rules.md#keep-up: judge
  overload by queueing growing through the run); a healthy
  one's fluctuates around a level.

Search: a rate at a tenth of one lone request's service rate must pass (else the SLO cannot be
met at any rate: ``Unknown`` with the lone request's figures); the rate doubles until it fails,
then bisects in log space until the bracket is within 1 %. The capacity is the bracket's low end
(a rate that passed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.kernels import F64, I64, SimulatedRun, simulate_replica
from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.result import Slo, StepCoefficients
from pipeline.unknown import Unknown

#: Bisection stops when high ÷ low is below this.
BRACKET_RATIO = 1.01
MAX_DOUBLINGS = 40


@dataclass(frozen=True)
class RequestSample:
    """Requests in simulation order (prompt, uncached prompt, output tokens) and unit-rate
    arrival times."""

    prompt: I64
    uncached: I64
    output: I64
    unit_arrivals: F64

    @property
    def size(self) -> int:
        return int(self.prompt.shape[0])


@dataclass(frozen=True)
class RunStats:
    """The SLO figures of one simulated run (after the warm-up share)."""

    rate_rps: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    gap_mean_ms: float
    ttft_mean_ms: float
    queue_growing: bool
    prefill_share: float
    cached_context_share: float

    def meets(self, slo: Slo) -> bool:
        itl = self.itl_p99_ms if slo.itl_definition == "per-gap" else self.tpot_p99_ms
        ttft_ok = self.ttft_p95_ms <= slo.ttft_p95_ms
        itl_ok = math.isnan(itl) or itl <= slo.itl_p99_ms  # NaN: every answer is one token
        return ttft_ok and itl_ok and not self.queue_growing


@dataclass(frozen=True)
class CapacitySearch:
    rate_rps: float
    at_capacity: RunStats
    simulations: int


def sample_requests(prompt: I64, output: I64, cached: I64, config: CapacityConfig) -> RequestSample:
    """``config.sample_requests`` requests drawn without replacement (all of them, shuffled,
    when the workload is smaller), with unit-rate Poisson arrival times; same seed, same draw."""
    rng = np.random.default_rng(config.seed)
    n = int(prompt.shape[0])
    take = min(n, config.sample_requests)
    index = rng.permutation(n)[:take] if take == n else rng.choice(n, size=take, replace=False)
    p = np.maximum(prompt[index].astype(np.int64), 1)
    # The last prompt token is always recomputed (pipeline/prefix/cache_rules.py: hits cap at
    # prompt − 1).
    c = np.clip(cached[index].astype(np.int64), 0, p - 1)
    o = np.maximum(output[index].astype(np.int64), 1)
    gaps = rng.exponential(1.0, size=take)
    return RequestSample(prompt=p, uncached=p - c, output=o, unit_arrivals=np.cumsum(gaps))


def _percentiles_ms(values: F64, low: float, high: float) -> tuple[float, float]:
    """Two percentiles of the finite ``values`` in ms (one pass over the array)."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return math.nan, math.nan
    a, b = np.percentile(finite, (low, high)) * 1000.0
    return float(a), float(b)


def run_stats(
    run: SimulatedRun,
    sample_output: I64,
    rate: float,
    config: CapacityConfig,
    ttft_limit_ms: float,
    request_latency_s: float = 0.0,
) -> RunStats:
    n = run.ttft_s.shape[0]
    warm = int(n * config.warmup_share)
    ttft = run.ttft_s[warm:] + request_latency_s
    gaps = run.gaps_s[run.gap_owner >= warm]
    multi = sample_output[warm:] > 1
    tpot = (
        (run.e2e_s[warm:] + request_latency_s - ttft) / np.maximum(sample_output[warm:] - 1, 1)
    )[multi]
    quarter = max(n // 4, 1)
    second = float(np.mean(run.wait_s[quarter : 2 * quarter]))
    last = float(np.mean(run.wait_s[n - quarter :]))
    busy = run.busy_s if run.busy_s > 0 else math.nan
    ttft_p50, ttft_p95 = _percentiles_ms(ttft, 50, 95)
    itl_p50, itl_p99 = _percentiles_ms(gaps, 50, 99)
    tpot_p50, tpot_p99 = _percentiles_ms(tpot, 50, 99)
    return RunStats(
        rate_rps=rate,
        ttft_p50_ms=ttft_p50,
        ttft_p95_ms=ttft_p95,
        itl_p50_ms=itl_p50,
        itl_p99_ms=itl_p99,
        tpot_p50_ms=tpot_p50,
        tpot_p99_ms=tpot_p99,
        gap_mean_ms=float(np.mean(gaps) * 1000.0) if gaps.size else math.nan,
        ttft_mean_ms=float(np.nanmean(ttft) * 1000.0) if ttft.size else math.nan,
        queue_growing=last > 2.0 * second + 0.05 * ttft_limit_ms / 1000.0,
        prefill_share=run.prefill_s / busy,
        cached_context_share=run.cached_context_s / busy,
    )


def simulate_at(
    coefficients: StepCoefficients,
    sample: RequestSample,
    rate: float,
    *,
    limits: SchedulingLimits,
    kv_tokens: int,
) -> SimulatedRun:
    """The replica (the deployment's ``limits``) serving ``sample`` at ``rate``."""
    return simulate_replica(
        sample.unit_arrivals / rate,
        sample.prompt,
        sample.uncached,
        sample.output,
        overhead_s=coefficients.overhead_s,
        prefill_s_per_token=coefficients.prefill_s_per_token,
        attention_s_per_pair=coefficients.attention_s_per_pair,
        decode_s_per_request=coefficients.decode_s_per_request,
        context_s_per_token=coefficients.context_s_per_token,
        token_budget=limits.budget,
        max_batch=limits.batch,
        kv_tokens=kv_tokens,
        chunked_prefill=limits.chunked,
    )


def attention_pairs(prompt: I64, uncached: I64) -> F64:
    """Token pairs a request's prefill attends over: its uncached tokens each see the cached
    prefix and, causally, the uncached tokens before them."""
    cached = (prompt - uncached).astype(np.float64)
    return uncached * (cached + uncached / 2.0)


def lone_request_s(
    coefficients: StepCoefficients, sample: RequestSample, limits: SchedulingLimits
) -> float:
    """Mean time one request takes on an otherwise empty replica (the search's starting scale)."""
    chunks = np.ceil(sample.uncached / limits.budget) if limits.chunked else 1.0
    decode_steps = sample.output - 1
    context = sample.prompt + sample.output / 2.0
    seconds = (
        coefficients.request_latency_s
        + (chunks + decode_steps) * coefficients.overhead_s
        + coefficients.prefill_s_per_token * sample.uncached
        + coefficients.attention_s_per_pair * attention_pairs(sample.prompt, sample.uncached)
        + decode_steps
        * (coefficients.decode_s_per_request + coefficients.context_s_per_token * context)
    )
    return float(np.mean(seconds))


def search_capacity(
    coefficients: StepCoefficients,
    sample: RequestSample,
    slo: Slo,
    *,
    limits: SchedulingLimits,
    kv_tokens: int,
    config: CapacityConfig,
) -> CapacitySearch | Unknown:
    """The largest rate meeting ``slo`` and keeping up (module docstring), or ``Unknown``."""
    too_big = int(np.sum(sample.prompt + sample.output > kv_tokens))
    if too_big:
        return Unknown(
            reason=f"{too_big} of {sample.size} sampled requests need more than the replica's "
            f"{kv_tokens:,} KV tokens (prompt + output): the replica cannot serve them"
        )
    lone = lone_request_s(coefficients, sample, limits)
    if not lone > 0:
        return Unknown(reason="the fitted step time is zero: no finite capacity")
    count = 0

    def evaluate(rate: float) -> RunStats:
        nonlocal count
        count += 1
        run = simulate_at(coefficients, sample, rate, limits=limits, kv_tokens=kv_tokens)
        return run_stats(
            run, sample.output, rate, config, slo.ttft_p95_ms, coefficients.request_latency_s
        )

    low = 0.1 / lone
    low_stats = evaluate(low)
    if not low_stats.meets(slo):
        return Unknown(
            reason=f"the SLO ({slo.describe()}) is not met even at {low:.3g} req/s (a tenth of "
            f"one lone request's rate): p95 TTFT {low_stats.ttft_p95_ms:,.0f} ms, p99 ITL "
            f"{low_stats.itl_p99_ms:,.1f} ms"
        )
    high = low
    for _ in range(MAX_DOUBLINGS):
        high *= 2.0
        stats = evaluate(high)
        if not stats.meets(slo):
            break
        low, low_stats = high, stats
    else:
        return Unknown(reason="no failing rate found: the fitted model never saturates")
    while high / low > BRACKET_RATIO:
        middle = math.sqrt(low * high)
        stats = evaluate(middle)
        if stats.meets(slo):
            low, low_stats = middle, stats
        else:
            high = middle
    return CapacitySearch(rate_rps=low, at_capacity=low_stats, simulations=count)
