"""Capacity at the SLO by simulation: the largest arrival rate a replica serves while meeting
the SLO and keeping up.

The workload's requests are sampled once (``CapacityConfig.sample_requests``, fixed seed) and
given unit-mean-rate arrival times once; a rate λ divides those times by λ. Every rate tried
therefore replays the same requests in the same order at the same relative spacing (common
random numbers), so pass/fail is (nearly) monotone in λ and bisection converges on one edge
instead of chasing sampling noise. How they arrive (:class:`Arrivals`):

* ``trace`` — the workload's own arrivals: ``arrival_windows`` contiguous runs of requests
  (consecutive in arrival order, so a burst stays a burst; a random subset would thin it towards
  Poisson), spread over the trace, each run's gaps divided by the mean gap of the ten times
  longer stretch of trace around it (the time of day's rate level drops out, the fleet being
  sized at the peak rate anyway; the run's own surge or lull against its surroundings stays),
  one mean gap between runs;
* ``gamma`` — requests drawn at random, Gamma-distributed gaps of mean 1 and the given CV
  (shape 1/CV², scale CV²): the renewal process with the measured burstiness, for traces whose
  timestamps cannot resolve gaps;
* ``poisson`` — exponential gaps (Gamma with CV 1: the same draw, so CV 1 gives the Poisson
  figure exactly).

The gaps are drawn after the requests, from the random state the sample keeps, so the Poisson
twin of a sample (:func:`poisson_twin`: the same requests, exponential gaps from that state) is
exactly the sample ``poisson`` draws.

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
then bisects in log space until the bracket is within 1 % (3 % for a fixed-point pass or a
sensitivity figure). The capacity is the bracket's low end (a rate that passed). Given a rate ``near`` the answer (the previous pass of the fleet's fixed
point, or the candidate's own capacity for its band and sensitivity), the search starts there
and steps by ×1.25 instead of doubling from the floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from pipeline.arrays import Tokens
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.kernels import F64, I64, SimulatedRun, simulate_replica
from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.result import Arrivals, Slo, StepCoefficients
from pipeline.unknown import Unknown

#: Bisection stops when high ÷ low is below this.
BRACKET_RATIO = 1.01
#: ... or below this for a figure that only steers (a fixed-point pass) or moves an input
#: (the sensitivity): 3 % where the capacity itself is searched to 1 %.
COARSE_BRACKET_RATIO = 1.03
MAX_DOUBLINGS = 40
#: A search told where the answer lies steps from there by this factor.
NEAR_STEP = 1.25
#: A trace run's gaps are scaled by the mean gap over this many times its length around it:
#: long enough that the run's own surge or lull shows against it (a run scaled by its own mean
#: would lose it), short enough that the time of day's rate level does not.
CONTEXT_RUNS = 10
POISSON = Arrivals(kind="poisson", cv=1.0, description="Poisson arrivals (inter-arrival CV 1)")


@dataclass(frozen=True)
class RequestSample:
    """Requests in simulation order (prompt, uncached prompt, output tokens), unit-rate
    arrival times and, when drawn from a workload, each one's row in it (``index``)."""

    prompt: I64
    uncached: I64
    output: I64
    unit_arrivals: F64
    index: I64 | None = None
    #: The random generator's state after the requests were drawn, before their gaps.
    gap_state: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def cached(self) -> I64:
        return self.prompt - self.uncached

    def with_cached(self, cached: Tokens) -> RequestSample:
        """The same requests with ``cached`` prompt tokens each (one per sampled request), capped
        at prompt − 1: the last prompt token is always recomputed
        (pipeline/prefix/cache_rules.py: hits cap at prompt − 1)."""
        c = np.clip(cached.astype(np.int64), 0, self.prompt - 1)
        return replace(self, uncached=self.prompt - c)

    def with_workload_cached(self, cached: Tokens) -> RequestSample:
        """The same requests with their rows' cached tokens out of ``cached`` (one per workload
        request)."""
        if self.index is None:
            raise ValueError("the sample does not say which workload rows it holds")
        return self.with_cached(cached[self.index])


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
    """The capacity found; its run's SLO figures are worked out when first asked for (most
    searches only steer or move an input, and a million pooled gaps are not free)."""

    rate_rps: float
    simulations: int
    statistics: Callable[[], RunStats] = field(repr=False, compare=False)

    @cached_property
    def at_capacity(self) -> RunStats:
        return self.statistics()


def gamma_gaps(rng: np.random.Generator, n: int, cv: float) -> F64:
    """``n`` Gamma gaps of mean 1 and coefficient of variation ``cv`` (shape 1/cv², scale cv²;
    cv 1 is numpy's exponential draw itself)."""
    shape = 1.0 / (cv * cv)
    gaps: F64 = rng.gamma(shape, 1.0 / shape, size=n)
    return gaps


def trace_windows(
    arrival_s: F64, take: int, windows: int, rng: np.random.Generator
) -> tuple[I64, F64]:
    """Rows and unit-rate arrival times of ``take`` requests in ``windows`` contiguous runs of
    the arrival-ordered trace (all of it, in order, when it is no larger). The runs are equally
    long and stratified: run s starts at a random point of the s-th share of the slack, so they
    never overlap and cover the trace from start to end. Each run's gaps are divided by the mean
    gap of the trace around it (``CONTEXT_RUNS`` times the run's length, centred on it, within
    the trace): the hour's rate level drops out, the run's own surge or lull against it stays.
    A context of simultaneous arrivals gives unit gaps; one unit gap precedes each run."""
    n = int(arrival_s.shape[0])
    if take >= n:
        spans = [(0, n)]
    else:
        k = max(1, min(windows, take))
        lengths = np.full(k, take // k, dtype=np.int64)
        lengths[: take % k] += 1
        slack = n - take
        offsets = np.floor((np.arange(k) + rng.random(k)) * slack / k).astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])) + offsets
        spans = [(int(a), int(a + m)) for a, m in zip(starts, lengths, strict=True)]
    index = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in spans])
    gaps = []
    for lo, hi in spans:
        reach = (hi - lo) * (CONTEXT_RUNS - 1) // 2
        first, last = max(lo - reach, 0), min(hi + reach, n) - 1
        mean = float(arrival_s[last] - arrival_s[first]) / (last - first) if last > first else 0.0
        inner = np.diff(arrival_s[lo:hi].astype(np.float64))
        gaps += [np.ones(1), inner / mean if mean > 0 else np.ones(inner.size)]
    return index, np.cumsum(np.concatenate(gaps))


def sample_requests(
    prompt: Tokens,
    output: Tokens,
    cached: Tokens,
    config: CapacityConfig,
    arrivals: Arrivals = POISSON,
    arrival_s: F64 | None = None,
) -> RequestSample:
    """``config.sample_requests`` requests with unit-rate arrival times (module docstring):
    ``trace`` takes contiguous runs of the arrival-ordered workload (``arrival_s``, seconds,
    ascending), the others draw requests without replacement (all of them, shuffled, when the
    workload is smaller) and Gamma / exponential gaps. Same seed, same draw."""
    rng = np.random.default_rng(config.seed)
    n = int(prompt.shape[0])
    take = min(n, config.sample_requests)
    if arrivals.kind == "trace":
        if arrival_s is None or arrival_s.shape[0] != n:
            raise ValueError("trace arrivals need one arrival time per workload request")
        index, unit = trace_windows(arrival_s, take, config.arrival_windows, rng)
        state = dict(rng.bit_generator.state)
    else:
        index = rng.permutation(n)[:take] if take == n else rng.choice(n, size=take, replace=False)
        state = dict(rng.bit_generator.state)
        cv = arrivals.cv if isinstance(arrivals.cv, float) else 1.0
        unit = np.cumsum(gamma_gaps(rng, take, cv))
    p = np.maximum(prompt[index].astype(np.int64), 1)
    o = np.maximum(output[index].astype(np.int64), 1)
    sample = RequestSample(
        prompt=p, uncached=p, output=o, unit_arrivals=unit, index=index, gap_state=state
    )
    return sample.with_cached(cached[index])


def poisson_twin(sample: RequestSample) -> RequestSample:
    """The same requests (and cached tokens) arriving as a Poisson stream: the exponential gaps
    a ``poisson`` sample draws from the state the requests left the generator in."""
    if sample.gap_state is None:
        raise ValueError("the sample keeps no random state to draw Poisson gaps from")
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = sample.gap_state
    return replace(sample, unit_arrivals=np.cumsum(gamma_gaps(rng, sample.size, 1.0)))


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
    gaps = run.gaps_s[run.gap_start[warm] :]
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


def _at_most(values: F64, q: float, limit: float) -> bool:
    """``np.percentile(values, q) * 1000 <= limit`` (values in s, limit in ms, linear
    interpolation) without sorting when counting the values above the limit decides it: the
    q-th percentile lies between the order statistics either side of rank (n − 1)·q/100."""
    n = values.size
    rank = (n - 1) * q / 100.0
    above = int(np.count_nonzero(values > limit / 1000.0))
    if n - above > math.ceil(rank):  # both neighbours at or below the limit
        return True
    if n - above <= math.floor(rank):  # the lower neighbour already above it
        return False
    return float(np.percentile(values, q) * 1000.0) <= limit


def slo_met(
    run: SimulatedRun,
    sample_output: I64,
    slo: Slo,
    config: CapacityConfig,
    request_latency_s: float = 0.0,
) -> bool:
    """``run_stats(...).meets(slo)``, working out only what the verdict needs (the pooled
    gaps of a few thousand answers are a million values; their p99 is counted, not sorted)."""
    n = run.ttft_s.shape[0]
    warm = int(n * config.warmup_share)
    ttft = run.ttft_s[warm:] + request_latency_s
    ttft = ttft[np.isfinite(ttft)]
    if not ttft.size or not _at_most(ttft, 95, slo.ttft_p95_ms):
        return False
    quarter = max(n // 4, 1)
    second = float(np.mean(run.wait_s[quarter : 2 * quarter]))
    last = float(np.mean(run.wait_s[n - quarter :]))
    if last > 2.0 * second + 0.05 * slo.ttft_p95_ms / 1000.0:
        return False
    if slo.itl_definition == "per-gap":
        # Gaps are pooled in request order: the warm-up's are a prefix.
        gaps = run.gaps_s[run.gap_start[warm] :]
    else:
        multi = sample_output[warm:] > 1
        gaps = ((run.e2e_s[warm:] - run.ttft_s[warm:]) / np.maximum(sample_output[warm:] - 1, 1))[
            multi
        ]
    finite = np.isfinite(gaps)
    if not finite.all():  # (a run's gaps are all finite: no copy of a million of them)
        gaps = gaps[finite]
    return not gaps.size or _at_most(gaps, 99, slo.itl_p99_ms)


def search_capacity(
    coefficients: StepCoefficients,
    sample: RequestSample,
    slo: Slo,
    *,
    limits: SchedulingLimits,
    kv_tokens: int,
    config: CapacityConfig,
    near: float | None = None,
    bracket: float = BRACKET_RATIO,
) -> CapacitySearch | Unknown:
    """The largest rate meeting ``slo`` and keeping up (module docstring), or ``Unknown``.
    ``near``: a rate close to the answer, where the search starts; ``bracket``: the high ÷ low
    ratio the bisection stops at."""
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
    latency = coefficients.request_latency_s

    def evaluate(rate: float) -> tuple[bool, SimulatedRun]:
        nonlocal count
        count += 1
        run = simulate_at(coefficients, sample, rate, limits=limits, kv_tokens=kv_tokens)
        return slo_met(run, sample.output, slo, config, latency), run

    def stats_of(rate: float, run: SimulatedRun) -> RunStats:
        return run_stats(run, sample.output, rate, config, slo.ttft_p95_ms, latency)

    floor = 0.1 / lone

    def unreachable(run: SimulatedRun) -> Unknown:
        stats = stats_of(floor, run)
        return Unknown(
            reason=f"the SLO ({slo.describe()}) is not met even at {floor:.3g} req/s (a tenth "
            f"of one lone request's rate): p95 TTFT {stats.ttft_p95_ms:,.0f} ms, p99 ITL "
            f"{stats.itl_p99_ms:,.1f} ms"
        )

    high: float | None = None
    step = 2.0
    if near is None or not near > floor:
        low = floor
        ok, low_run = evaluate(low)
        if not ok:
            return unreachable(low_run)
    else:
        step = NEAR_STEP
        low = near
        ok, low_run = evaluate(low)
        while not ok:
            high = low
            low = max(low / NEAR_STEP, floor)
            ok, low_run = evaluate(low)
            if low == floor and not ok:
                return unreachable(low_run)
    if high is None:
        for _ in range(MAX_DOUBLINGS):
            candidate = low * step
            ok, run = evaluate(candidate)
            if not ok:
                high = candidate
                break
            low, low_run = candidate, run
        else:
            return Unknown(reason="no failing rate found: the fitted model never saturates")
    while high / low > bracket:
        middle = math.sqrt(low * high)
        ok, run = evaluate(middle)
        if ok:
            low, low_run = middle, run
        else:
            high = middle
    final_rate, final_run = low, low_run
    return CapacitySearch(
        rate_rps=low, simulations=count, statistics=lambda: stats_of(final_rate, final_run)
    )
