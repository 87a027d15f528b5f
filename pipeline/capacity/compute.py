"""The capacity core's entry points: a fitted serving model carried to the workload's own mix,
the fleet and cost that follow, and routing priced through the model. Pure functions; no I/O.

Cost formulas (docs/capacity.md, "cost"; the arithmetic is :mod:`pipeline.costing`'s):

* replicas = ⌈peak rate ÷ (capacity × headroom)⌉ (+ 1 with N+1), at least 1;
  monthly cost = replicas × GPUs per replica × $/GPU-hour × hours a month;
* utilisation = rate ÷ (replicas × capacity), at the mean and at the peak rate;
* the cached tokens the capacity is searched with come from the fleet's own prefix cache
  (:mod:`pipeline.capacity.fleet_cache`) at the fleet's replica count, and the fleet's size from
  the capacity: the two are iterated to a fixed point (:func:`settle_fleet`);
* per 1M tokens of this workload, at the SLO capacity (a replica costs GPUs × $/GPU-hour and
  serves capacity × 3600 requests an hour there): the replica's time splits into a prefill
  share (prefill work plus the step overhead in proportion to prefill tokens), a cached-context
  share (decodes reading the KV of prefix-cached prompt tokens) and the rest, decode; then
  ``cost_per_1m_input_usd`` = hourly cost × prefill share ÷ (uncached prompt tokens an hour) ×
  10⁶, ``cost_per_1m_cached_input_usd`` = hourly cost × cached-context share ÷ (cached prompt
  tokens an hour) × 10⁶, ``cost_per_1m_output_usd`` = hourly cost × decode share ÷ (output
  tokens an hour) × 10⁶, so that the three prices times the tokens add up to the whole bill;
  ``all_in_cost_per_1m_output_usd`` = hourly cost ÷ (output tokens an hour) × 10⁶ (the
  benchmark's own definition, comparable with ``benchmark_cost_per_1m_output_usd``).
* the capacity band (:func:`capacity_band`) carried through the same formulas: replicas at its
  high end (fewer) and low end (more), the monthly cost of each, the all-in cost per 1M output
  tokens at each end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import polars as pl

from pipeline.arrays import Tokens, narrow
from pipeline.capacity.binding import binding_limit
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.fit import CONTEXT_SPREAD, mean_decode_context
from pipeline.capacity.fleet_cache import CacheReplay
from pipeline.capacity.kernels import F64
from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import (
    Arrivals,
    CandidateCapacity,
    CapacityBasis,
    CapacityResult,
    CapacityVariant,
    Deployment,
    FleetCache,
    FleetStep,
    PredictionCheck,
    RoutingValue,
    ServingModel,
    Slo,
    StepCoefficients,
    TransferDistance,
    WorkloadCost,
    WorkloadMix,
)
from pipeline.capacity.search import (
    BRACKET_RATIO,
    COARSE_BRACKET_RATIO,
    POISSON,
    CapacitySearch,
    RequestSample,
    poisson_twin,
    run_stats,
    sample_requests,
    search_capacity,
    simulate_at,
)
from pipeline.costing import (
    HOURS_PER_MONTH,
    SECONDS_PER_HOUR,
    Band,
    monthly_usd,
    per_million,
    replicas_band,
    replicas_for,
)
from pipeline.thresholds import LENGTH_FACTOR
from pipeline.unknown import Unknown

#: A capacity that moves more than this over the prefill budgets the benchmark cannot tell
#: apart is not given: it depends on a limit nobody stated.
BUDGET_SENSITIVITY = 0.10
CAPACITY_METHOD = (
    "simulated: the workload's own sampled requests, arriving as the candidate's arrivals say "
    "and each with the prompt tokens its replica's prefix cache holds in the fleet's replay, "
    "through the fitted step model (continuous batching, chunked prefill, KV-bounded batch), "
    "bisection on the rate for the largest one meeting the SLO with a queue that does not grow"
)
#: Points of its prompt each request's cached tokens move by in the cached-share sensitivity.
CACHED_SHIFT = 0.2
#: Passes of the fleet-size / cache fixed point before it is called unsettled.
MAX_FLEET_PASSES = 8
#: A pass is settled when the replicas its capacity needs are within this share of the count
#: it was replayed at (and would run the same routing): a replica more or fewer in a fleet of
#: 20 or more moves the capacity by less than the passes' 3 % search resolves (a million
#: generated multi-turn requests, cache-aware: 74.8 % cached at 31 replicas, 75.9 % at 32,
#: capacity 5.31 against 5.35 req/s), and each further replay is a pass over the whole trace.
FLEET_COUNT_TOLERANCE = 0.05
#: The widest residual spread the band scales the step by (a fit off by more than half is
#: withheld by the self-check before it gets here).
MAX_RESIDUAL_SPREAD = 0.5


@dataclass(frozen=True)
class WorkloadRequests:
    """The workload's requests: prompt, output and prefix-cached prompt tokens per request
    (int32 where they fit: one of each per request of the whole trace), and (when known) their
    arrival times in seconds, ascending."""

    prompt: Tokens
    output: Tokens
    cached: Tokens
    arrival_s: F64 | None = None

    def __post_init__(self) -> None:
        n = self.prompt.shape[0]
        if self.output.shape[0] != n or self.cached.shape[0] != n:
            raise ValueError("prompt, output and cached token arrays differ in length")
        if n == 0:
            raise ValueError("the workload has no requests")
        if self.arrival_s is not None and (
            self.arrival_s.shape[0] != n or bool(np.any(np.diff(self.arrival_s) < 0))
        ):
            raise ValueError("arrival times must be one per request, ascending")

    def with_cached(self, cached: Tokens) -> WorkloadRequests:
        return replace(self, cached=cached)

    @property
    def prompt_mean(self) -> float:
        return float(self.prompt.mean())

    @property
    def output_mean(self) -> float:
        return float(self.output.mean())

    @property
    def cached_mean(self) -> float:
        return float(np.minimum(self.cached, np.maximum(self.prompt - 1, 0)).mean())


def workload_requests(
    requests: pl.DataFrame,
    *,
    cached_share: float = 0.0,
    cached_column: str | None = None,
) -> WorkloadRequests:
    """The arrays from the ingest stage's canonical requests (``prompt_tokens``,
    ``output_tokens``, and ``arrival`` when present: seconds from the first, in the frame's
    order, which must then be ascending) and either a per-request cached-token column (the
    replay's hits) or one cached share of every prompt. Requests without a prompt or output
    length are left out."""
    if not 0.0 <= cached_share < 1.0:
        raise ValueError(f"cached_share must be in [0, 1), got {cached_share}")
    timed = "arrival" in requests.columns
    columns = [
        "prompt_tokens",
        "output_tokens",
        *([cached_column] if cached_column else []),
        *(["arrival"] if timed else []),
    ]
    frame = requests.select(columns).drop_nulls(["prompt_tokens", "output_tokens"])
    prompt = frame.get_column("prompt_tokens").to_numpy().astype(np.int64)
    output = frame.get_column("output_tokens").to_numpy().astype(np.int64)
    if cached_column:
        cached = frame.get_column(cached_column).fill_null(0).to_numpy().astype(np.int64)
    else:
        cached = np.floor(prompt * cached_share).astype(np.int64)
    arrival_s = None
    if timed and frame.height and frame.get_column("arrival").null_count() == 0:
        micros = frame.get_column("arrival").dt.epoch("us").to_numpy().astype(np.int64)
        arrival_s = (micros - micros[0]) / 1e6
    return WorkloadRequests(
        prompt=narrow(np.maximum(prompt, 1)),
        output=narrow(np.maximum(output, 1)),
        cached=narrow(cached),
        arrival_s=arrival_s,
    )


def transfer_distance(model: ServingModel, workload: WorkloadRequests) -> TransferDistance:
    """How far the workload's mix is from the benchmark's (ratios of means; range check): far
    beyond ``LENGTH_FACTOR`` either way, the factor past which the bench stage already flags a
    benchmark's lengths as unlike production's (one threshold for both stages)."""
    prompt_ratio = workload.prompt_mean / model.bench_prompt_tokens_mean
    output_ratio = workload.output_mean / model.bench_output_tokens_mean
    uncached_ratio = (workload.prompt_mean - workload.cached_mean) / model.bench_prompt_tokens_mean
    lo_p, hi_p = model.bench_prompt_tokens_range
    lo_o, hi_o = model.bench_output_tokens_range
    outside = not (lo_p <= workload.prompt_mean <= hi_p and lo_o <= workload.output_mean <= hi_o)
    far = any(
        r > LENGTH_FACTOR or r < 1.0 / LENGTH_FACTOR
        for r in (prompt_ratio, output_ratio, uncached_ratio)
    )
    parts = [
        f"measured at {model.bench_prompt_tokens_mean:,.0f}-token prompts and "
        f"{model.bench_output_tokens_mean:,.0f}-token answers",
        f"the workload's prompts are {_times(prompt_ratio)} and its answers {_times(output_ratio)}",
    ]
    if workload.cached_mean > 0:
        parts.append(
            f"{workload.cached_mean / workload.prompt_mean:.0%} of its prompt tokens cached"
        )
    if outside:
        parts.append("outside the lengths the benchmark measured")
    return TransferDistance(
        prompt_ratio=prompt_ratio,
        output_ratio=output_ratio,
        uncached_prompt_ratio=uncached_ratio,
        outside_fitted_range=outside,
        far=far,
        description="; ".join(parts),
    )


def _times(ratio: float) -> str:
    if ratio >= 1.0:
        return f"{ratio:.3g}× longer" if ratio >= 1.05 else "about as long"
    return f"{1.0 / ratio:.3g}× shorter" if ratio <= 0.95 else "about as long"


def _model_name(name: str) -> str:
    """A model name without its hub organisation, case-folded (``meta-llama/Llama-3.1-8B`` and
    ``llama-3.1-8b`` are one model)."""
    return name.rsplit("/", 1)[-1].casefold()


def deployment_model_shape(
    shape: ModelShape | None, benchmarked: str | None, team_models: tuple[str, ...]
) -> tuple[ModelShape | None, str | None]:
    """The roofline prior's model for one benchmarked deployment, and what to say about it.

    ``requirements.kv_cache`` describes the team's model. It is this deployment's only when the
    benchmark served that model (one of ``requirements.models``); for another model the prior
    would price the wrong weights, so there is none, and the capacity found is the benchmarked
    model's (a transfer across models: provisional). Returns (shape or None, the note or the
    provisional reason: None when nothing needs saying)."""
    if shape is None:
        return None, None
    if not team_models:
        return shape, (
            "requirements.models is not set: requirements.kv_cache is taken to describe "
            f"{benchmarked or 'the benchmarked model'}"
        )
    if benchmarked is None:
        return shape, (
            "the benchmark does not name its model: requirements.kv_cache "
            f"({', '.join(team_models)}) is taken to describe it"
        )
    if _model_name(benchmarked) in {_model_name(m) for m in team_models}:
        return shape, None
    return None, (
        f"benchmarked on {benchmarked}, not your model ({', '.join(team_models)}): no roofline "
        "prior from requirements.kv_cache (it describes yours), and the capacity is "
        f"{benchmarked}'s"
    )


def _provisional_reason(model: ServingModel, transfer: TransferDistance) -> str | None:
    reasons = []
    if transfer.far:
        reasons.append(f"far outside the measured mix ({transfer.description})")
    if model.prefill_split_basis == "prior":
        reasons.append("the prefill/decode split comes from the roofline prior, not the data")
    if model.context_basis == "assumed_zero" and abs(transfer.prompt_ratio - 1.0) > 0.5:
        reasons.append("the cost of reading a longer context is assumed 0 (no prior)")
    if model.attention_basis == "assumed_zero" and abs(transfer.prompt_ratio - 1.0) > 0.5:
        reasons.append(f"prefill attention is left out (the model's shape: {model.model_shape})")
    return "; ".join(reasons) or None


def fleet_replicas(capacity_rps: float, peak_rate_rps: float, config: CapacityConfig) -> int:
    """Replicas the peak needs: ⌈peak ÷ (capacity × headroom)⌉, at least 1, + 1 with N+1."""
    return replicas_for(peak_rate_rps, capacity_rps, config.headroom, config.n_plus_one)


class CacheSource(Protocol):
    """Per-request cached tokens at a fleet size and KV pool (:meth:`CacheReplays.at`), and a
    cached share to start from before any replay (:meth:`CacheReplays.estimate`)."""

    def at(self, replicas: int, kv_tokens: int) -> CacheReplay | Unknown: ...

    def estimate(self, kv_tokens: int) -> float | None: ...

    def routing(self, replicas: int, kv_tokens: int) -> tuple[str, str]: ...


def within_fleet_tolerance(replicas: int, needed: int | None) -> bool:
    """Whether a pass replayed at ``replicas`` that needs ``needed`` is settled by count:
    the same count, or within ``FLEET_COUNT_TOLERANCE`` of it."""
    return needed is not None and abs(needed - replicas) <= FLEET_COUNT_TOLERANCE * replicas


@dataclass(frozen=True)
class SettledFleet:
    """The fixed point's outcome: the capacity, the sample it was searched with, the cached
    tokens per workload request (None: the workload's own) and the record of the replay."""

    found: CapacitySearch | Unknown
    sample: RequestSample
    cached: Tokens | None
    record: FleetCache | Unknown | None


def settle_fleet(
    coefficients: StepCoefficients,
    sample: RequestSample,
    slo: Slo,
    *,
    limits: SchedulingLimits,
    kv_tokens: int,
    kv_source: str,
    peak_rate_rps: float,
    config: CapacityConfig,
    cache: CacheSource | None,
) -> SettledFleet:
    """Fleet size and cache share to a fixed point: the cache replayed at a replica count gives
    each sampled request its cached tokens, the capacity with them the replicas the peak
    needs; repeat until the count repeats. The first count comes before any replay, from the
    share the simulation's own scenarios found (``estimate``; recorded as a pass at 0
    replicas): each replay costs a pass over the whole trace, and a count near the answer
    settles in one or two; when no rate meets the SLO at that share, the first count is one
    replica. A pass needing a count within ``FLEET_COUNT_TOLERANCE`` of its own, under the same
    routing, is settled without a replay at that count. Should the count
    alternate (the routing chosen, or the cache's balance, can change with it), the pass
    needing the most replicas is kept (the costlier fleet) and the record says it did not
    settle. The passes search to 3 % (they steer), the kept one then to 1 %."""
    if cache is None:
        found = search_capacity(
            coefficients, sample, slo, limits=limits, kv_tokens=kv_tokens, config=config
        )
        return SettledFleet(found, sample, None, None)
    # The start, before any replay: every prompt cached at the share the simulation's own
    # scenarios found (none when they know no share).
    share = min(max(cache.estimate(kv_tokens) or 0.0, 0.0), 1.0)
    guessed = sample.with_cached(np.floor(sample.prompt * share).astype(np.int64))
    start = search_capacity(
        coefficients,
        guessed,
        slo,
        limits=limits,
        kv_tokens=kv_tokens,
        config=config,
        bracket=COARSE_BRACKET_RATIO,
    )
    first = (
        1 if isinstance(start, Unknown) else fleet_replicas(start.rate_rps, peak_rate_rps, config)
    )
    replay = cache.at(first, kv_tokens)
    if isinstance(replay, Unknown):
        # No replay: the cached tokens the workload came with.
        found = search_capacity(
            coefficients, sample, slo, limits=limits, kv_tokens=kv_tokens, config=config
        )
        return SettledFleet(found, sample, None, replay)
    steps = [
        FleetStep(
            replicas=0,
            cached_share=share,
            capacity_rps=start if isinstance(start, Unknown) else start.rate_rps,
            replicas_needed=None if isinstance(start, Unknown) else first,
        )
    ]
    near = None if isinstance(start, Unknown) else start.rate_rps
    passes: list[tuple[CacheReplay, RequestSample, CapacitySearch | Unknown]] = []
    close = False
    for _ in range(MAX_FLEET_PASSES):
        drawn = sample.with_workload_cached(replay.cached)
        found = search_capacity(
            coefficients,
            drawn,
            slo,
            limits=limits,
            kv_tokens=kv_tokens,
            config=config,
            near=near,
            bracket=COARSE_BRACKET_RATIO,
        )
        passes.append((replay, drawn, found))
        needed = (
            None
            if isinstance(found, Unknown)
            else fleet_replicas(found.rate_rps, peak_rate_rps, config)
        )
        steps.append(
            FleetStep(
                replicas=replay.replicas,
                cached_share=replay.share,
                capacity_rps=found if isinstance(found, Unknown) else found.rate_rps,
                replicas_needed=needed,
            )
        )
        if isinstance(found, Unknown) or needed is None:
            break
        if any(p[0].replicas == needed for p in passes):
            break
        if within_fleet_tolerance(replay.replicas, needed) and (
            cache.routing(needed, kv_tokens)[0] == replay.routing
        ):
            close = True  # settled within the tolerance: no replay at the neighbouring count
            break
        following = cache.at(needed, kv_tokens)
        if isinstance(following, Unknown):
            break  # the last pass stands; the record says the fleet did not settle
        replay, near = following, found.rate_rps
    replayed = steps[1:]  # one per pass
    last = replayed[-1]
    settled = close or last.replicas_needed in (None, last.replicas)
    chosen = len(replayed) - 1
    if not settled:
        # Alternating (or still moving): from where the cycle began, the costliest pass.
        begin = next((i for i, st in enumerate(replayed) if st.replicas == last.replicas_needed), 0)
        chosen = max(range(begin, len(replayed)), key=lambda i: replayed[i].replicas_needed or 0)
    replay, drawn, found = passes[chosen]
    if not isinstance(found, Unknown):  # the kept pass, to the capacity's own precision
        found = search_capacity(
            coefficients,
            drawn,
            slo,
            limits=limits,
            kv_tokens=kv_tokens,
            config=config,
            near=found.rate_rps,
        )
    record = FleetCache(
        replicas=replay.replicas,
        kv_tokens=replay.kv_tokens,
        kv_source=kv_source,
        routing=replay.routing,
        block_size=replay.block_size,
        cached_share=replay.share,
        description=replay.description,
        steps=steps,
        settled=settled,
    )
    return SettledFleet(found, drawn, replay.cached, record)


def _searched(
    coefficients: StepCoefficients,
    sample: RequestSample,
    slo: Slo,
    limits: SchedulingLimits,
    kv_tokens: int,
    config: CapacityConfig,
    near: float,
    bracket: float = BRACKET_RATIO,
) -> float | Unknown:
    found = search_capacity(
        coefficients,
        sample,
        slo,
        limits=limits,
        kv_tokens=kv_tokens,
        config=config,
        near=near,
        bracket=bracket,
    )
    return found if isinstance(found, Unknown) else found.rate_rps


def capacity_sensitivity(
    coefficients: StepCoefficients,
    sample: RequestSample,
    slo: Slo,
    *,
    limits: SchedulingLimits,
    kv_tokens: int,
    config: CapacityConfig,
    capacity_rps: float,
) -> list[CapacityVariant]:
    """The capacity with one input moved at a time, each against ``capacity_rps``: Poisson
    arrivals instead of the traffic's (the same requests and cached tokens), every request's
    cached tokens ∓ ``CACHED_SHIFT`` of its prompt, and the prefill token budget halved and
    doubled (the running-request limit capped at the budget). Each is searched to 3 %."""
    share = float(sample.cached.sum() / sample.prompt.sum())
    cases: list[tuple[str, str, RequestSample, SchedulingLimits]] = []
    twin = poisson_twin(sample)
    same = np.array_equal(twin.unit_arrivals, sample.unit_arrivals)
    cases.append(
        (
            "poisson",
            "Poisson arrivals (CV 1)" + (": the search's own" if same else ""),
            sample if same else twin,
            limits,
        )
    )
    shift = np.floor(CACHED_SHIFT * sample.prompt).astype(np.int64)
    for key, sign in (("cached_minus", -1), ("cached_plus", 1)):
        moved = sample.with_cached(sample.cached + sign * shift)
        moved_share = float(moved.cached.sum() / moved.prompt.sum())
        cases.append(
            (
                key,
                f"cached share {moved_share:.0%} ({'−' if sign < 0 else '+'}"
                f"{CACHED_SHIFT * 100:.0f} points of each prompt, from {share:.0%})",
                moved,
                limits,
            )
        )
    for key, factor, word in (("budget_half", 0.5, "half"), ("budget_double", 2.0, "double")):
        budget = max(int(limits.budget * factor), 1)
        cases.append(
            (
                key,
                f"prefill budget {budget:,} tokens a step ({word} {limits.budget:,})",
                sample,
                limits.moved(budget=budget, batch=min(limits.batch, budget)),
            )
        )
    variants = []
    for key, description, moved, settings in cases:
        unchanged = (
            settings is limits
            and moved.unit_arrivals is sample.unit_arrivals
            and np.array_equal(moved.uncached, sample.uncached)
        )
        capacity = (
            capacity_rps
            if unchanged
            else _searched(
                coefficients,
                moved,
                slo,
                settings,
                kv_tokens,
                config,
                capacity_rps,
                COARSE_BRACKET_RATIO,
            )
        )
        variants.append(
            CapacityVariant(
                key=key,  # type: ignore[arg-type]
                description=description,
                capacity_rps=capacity,
                change=capacity if isinstance(capacity, Unknown) else capacity / capacity_rps - 1.0,
            )
        )
    return variants


def workload_cost(
    search: CapacitySearch,
    capacity_band_rps: Band,
    workload: WorkloadRequests,
    *,
    gpus_per_replica: int,
    gpu_hour_usd: float,
    peak_rate_rps: float,
    mean_rate_rps: float | None,
    config: CapacityConfig,
) -> WorkloadCost:
    """Fleet, monthly cost, utilisation and per-1M-token prices, each with its band where the
    capacity band moves it (module docstring)."""
    capacity = search.rate_rps
    replicas = fleet_replicas(capacity, peak_rate_rps, config)
    fewest, most = replicas_band(
        peak_rate_rps, capacity_band_rps, config.headroom, config.n_plus_one
    )
    band_low, band_high = capacity_band_rps
    gpus = replicas * gpus_per_replica
    monthly = monthly_usd(gpus, gpu_hour_usd)
    hourly = gpus_per_replica * gpu_hour_usd
    stats = search.at_capacity
    prefill_share = min(max(stats.prefill_share, 0.0), 1.0)
    cached_share = min(max(stats.cached_context_share, 0.0), 1.0 - prefill_share)
    decode_share = 1.0 - prefill_share - cached_share
    per_hour = capacity * SECONDS_PER_HOUR
    output_per_hour = per_hour * workload.output_mean
    uncached_per_hour = per_hour * (workload.prompt_mean - workload.cached_mean)
    cached_per_hour = per_hour * workload.cached_mean
    input_cost: float | Unknown = (
        per_million(hourly * prefill_share, uncached_per_hour)
        if uncached_per_hour > 0
        else Unknown(reason="no uncached prompt tokens")
    )
    cached_cost: float | Unknown = (
        Unknown(reason="the workload has no prefix-cached prompt tokens")
        if cached_per_hour <= 0
        # A model whose context and attention costs came out 0 cannot price a cached token:
        # 0 would be a figure the benchmark never showed.
        else Unknown(reason="the fitted model gives reading cached context no GPU time")
        if cached_share <= 0
        else per_million(hourly * cached_share, cached_per_hour)
    )
    if mean_rate_rps is not None and mean_rate_rps > 0:
        average: float | Unknown = mean_rate_rps / (replicas * capacity)
        fleet: float | Unknown = per_million(
            monthly, mean_rate_rps * workload.output_mean * SECONDS_PER_HOUR * HOURS_PER_MONTH
        )
    else:
        average = fleet = Unknown(reason="the workload's mean rate is not known")
    formula = (
        f"replicas = ceil({peak_rate_rps:.4g} ÷ ({capacity:.4g} × {config.headroom:g})) "
        f"{'+ 1 (N+1) ' if config.n_plus_one else ''}= {replicas}; "
        f"{replicas} × {gpus_per_replica} GPU × ${gpu_hour_usd:g}/h × {HOURS_PER_MONTH:g} h = "
        f"${monthly:,.0f}/month; output ${hourly:g}/h × {decode_share:.3f} decode share ÷ "
        f"({capacity:.4g} req/s × {workload.output_mean:.1f} tokens × {SECONDS_PER_HOUR:g}) × 10^6"
    )
    return WorkloadCost(
        replicas=replicas,
        gpus=gpus,
        gpu_hour_usd=gpu_hour_usd,
        headroom=config.headroom,
        n_plus_one=config.n_plus_one,
        monthly_cost_usd=monthly,
        replicas_band=(fewest, most),
        monthly_cost_band_usd=(
            monthly_usd(fewest * gpus_per_replica, gpu_hour_usd),
            monthly_usd(most * gpus_per_replica, gpu_hour_usd),
        ),
        average_utilisation=average,
        peak_utilisation=peak_rate_rps / (replicas * capacity),
        prefill_share=prefill_share,
        cached_context_share=cached_share,
        decode_share=decode_share,
        cost_per_1m_output_usd=per_million(hourly * decode_share, output_per_hour),
        cost_per_1m_input_usd=input_cost,
        cost_per_1m_cached_input_usd=cached_cost,
        all_in_cost_per_1m_output_usd=per_million(hourly, output_per_hour),
        all_in_cost_per_1m_output_band_usd=(
            per_million(hourly, band_high * SECONDS_PER_HOUR * workload.output_mean),
            per_million(hourly, band_low * SECONDS_PER_HOUR * workload.output_mean),
        ),
        fleet_cost_per_1m_output_usd=fleet,
        formula=formula,
    )


def carry_to_workload(
    candidate: str,
    model: ServingModel | Unknown,
    workload: WorkloadRequests,
    slo: Slo,
    *,
    kv_tokens: int,
    gpu_hour_usd: float | None,
    peak_rate_rps: float,
    mean_rate_rps: float | None,
    config: CapacityConfig,
    deployment_gpus: int | None = None,
    measured_on_workload: bool = False,
    benchmark_cost_per_1m_output_usd: float | None = None,
    sample: RequestSample | None = None,
    arrivals: Arrivals = POISSON,
    fleet_cache: CacheSource | None = None,
    kv_source: str = "as given",
) -> CandidateCapacity:
    """Capacity at the SLO for the workload's own mix, its band, transfer distance, cost and
    sensitivity.

    ``kv_tokens``: the replica's KV pool (``kv_source`` says whence), also its prefix cache's
    size in ``fleet_cache``. ``sample``: the workload's sampled requests when the caller shares
    one draw between candidates (drawn with ``arrivals``). ``fleet_cache``: where per-request
    cached tokens come from at a fleet size (:func:`settle_fleet`); None: the workload's own
    ``cached``."""
    basis: CapacityBasis = "measured" if measured_on_workload else "transferred"
    bench_cost: float | Unknown = (
        benchmark_cost_per_1m_output_usd
        if benchmark_cost_per_1m_output_usd is not None
        else Unknown(reason="the bench stage gave no cost for this candidate")
    )
    common: dict[str, Any] = {
        "candidate": candidate,
        "capacity_basis": basis,
        "capacity_method": CAPACITY_METHOD,
        "benchmark_cost_per_1m_output_usd": bench_cost,
        "arrivals": arrivals,
    }
    if isinstance(model, Unknown):
        return CandidateCapacity(
            deployment=_placeholder_deployment(candidate, deployment_gpus),
            serving_model=model,
            workload_capacity_rps=model,
            workload_capacity_band_rps=model,
            transfer=model,
            provisional_reason=f"no serving model: {model.reason}",
            cost=model,
            binding=model,
            **common,
        )
    drawn = sample or sample_requests(
        workload.prompt, workload.output, workload.cached, config, arrivals, workload.arrival_s
    )
    settled, found, budget_note = _carried_capacity(
        model,
        drawn,
        slo,
        kv_tokens=kv_tokens,
        kv_source=kv_source,
        peak_rate_rps=peak_rate_rps,
        config=config,
        fleet_cache=fleet_cache,
        measured_on_workload=measured_on_workload,
    )
    if settled.cached is not None:
        workload = workload.with_cached(settled.cached)
    drawn = settled.sample
    transfer = transfer_distance(model, workload)
    provisional = _provisional_reason(model, transfer)
    common |= {
        "deployment": model.deployment,
        "serving_model": model,
        "transfer": transfer,
        "provisional_reason": provisional,
        "fleet_cache": settled.record,
        "budget_sensitivity": budget_note,
    }
    if isinstance(found, Unknown):
        return CandidateCapacity(
            workload_capacity_rps=found,
            workload_capacity_band_rps=found,
            cost=found,
            binding=found,
            **common,
        )
    spread = residual_spread(model, config)
    band: list[float] = []
    for factor in (1.0 + spread, 1.0 - spread):  # slower steps → the band's low end
        edge = _searched(
            model.coefficients.scaled(factor),
            drawn,
            slo,
            model.limits,
            kv_tokens,
            config,
            found.rate_rps / factor,
        )
        band.append(edge if not isinstance(edge, Unknown) else math.nan)
    low = band[0] if math.isfinite(band[0]) else found.rate_rps * (1 - spread)
    high = band[1] if math.isfinite(band[1]) else found.rate_rps * (1 + spread)
    residual = (min(low, found.rate_rps), max(high, found.rate_rps))
    # A capacity measured on this workload's own traffic has only its measurement noise; a
    # transferred one also the error the project measured carrying capacities to other mixes.
    validation = 0.0 if measured_on_workload else config.validation_error
    capacity_band_rps = capacity_band(found.rate_rps, residual, validation)
    cost: WorkloadCost | Unknown
    if gpu_hour_usd is None:
        cost = Unknown(reason=f"no $/GPU-hour for {model.deployment.gpu_type}")
    else:
        cost = workload_cost(
            found,
            capacity_band_rps,
            workload,
            gpus_per_replica=model.deployment.gpu_count,
            gpu_hour_usd=gpu_hour_usd,
            peak_rate_rps=peak_rate_rps,
            mean_rate_rps=mean_rate_rps,
            config=config,
        )
    return CandidateCapacity(
        workload_capacity_rps=found.rate_rps,
        workload_capacity_band_rps=capacity_band_rps,
        band_basis=band_basis(found.rate_rps, residual, spread, validation),
        cost=cost,
        binding=binding_limit(model, drawn, found.rate_rps, slo, kv_tokens, config),
        sensitivity=capacity_sensitivity(
            model.coefficients,
            drawn,
            slo,
            limits=model.limits,
            kv_tokens=kv_tokens,
            config=config,
            capacity_rps=found.rate_rps,
        ),
        **common,
    )


def residual_spread(model: ServingModel, config: CapacityConfig) -> float:
    """The fit's residual spread the band's searches scale the step by: at least
    ``min_band_spread`` (a fit with tiny residuals on one mix still extrapolates), at most
    ``MAX_RESIDUAL_SPREAD``."""
    return min(max(model.residual_spread, config.min_band_spread), MAX_RESIDUAL_SPREAD)


def capacity_band(capacity_rps: float, residual_band_rps: Band, validation_error: float) -> Band:
    """The capacity band: the fit residuals' band combined with the validation error.

    The validation error ``v`` bounds a transferred capacity's signed error (model ÷ measured
    − 1 within ±v), so the true capacity lies within capacity ÷ (1 + v) … capacity ÷ (1 − v).
    Both are ratios to the capacity, and independent (how well the model reproduces its own
    points, how wrong its form is at another mix), so each end's distance from the capacity is
    combined in log space in quadrature: ln(high ÷ capacity) = √(ln(residual high ÷
    capacity)² + ln(1 ÷ (1 − v))²), and likewise below (docs/capacity.md, "The band")."""
    low, high = residual_band_rps
    below = math.hypot(math.log(capacity_rps / low), math.log1p(validation_error))
    above = math.hypot(math.log(high / capacity_rps), -math.log1p(-validation_error))
    return capacity_rps * math.exp(-below), capacity_rps * math.exp(above)


def band_basis(
    capacity_rps: float, residual_band_rps: Band, spread: float, validation: float
) -> str:
    """Where a capacity band comes from, in a sentence."""
    low, high = residual_band_rps
    residual = f"the fit's residuals (steps ± {spread:.0%}: {low:.3g}–{high:.3g} req/s)"
    if not validation:
        return f"{residual} only: measured on this workload's own traffic"
    return (
        f"{residual} combined with the validation error of a transferred capacity "
        f"(± {validation:.0%}: {capacity_rps / (1 + validation):.3g}–"
        f"{capacity_rps / (1 - validation):.3g} req/s)"
    )


def unidentified_context(model: ServingModel, drawn: RequestSample) -> str | None:
    """Why ``model`` cannot price the context the sampled requests read, or None.

    With one request mix and no roofline prior the fit cannot tell the cost of reading context
    from the cost of a decoding request (``context_basis`` ``assumed_zero``): both grow with
    every decode alike at one context length. Past ``CONTEXT_SPREAD`` from the benchmark's mean
    context either way, the carried capacity would rest on that guess (on llama.cpp on a CPU
    it put a 4.6× longer context's capacity 46-66 % too high, docs/capacity.md), so none is
    carried."""
    if model.context_basis != "assumed_zero":
        return None
    bench = model.bench_prompt_tokens_mean + model.bench_output_tokens_mean / 2.0
    workload = mean_decode_context(drawn.prompt, drawn.output) or bench
    ratio = workload / max(bench, 1.0)
    if 1.0 / CONTEXT_SPREAD < ratio < CONTEXT_SPREAD:
        return None
    # The prior's reason without its list of known GPUs: the sentence is long enough.
    prior = model.prior.reason.split(" (")[0] if isinstance(model.prior, Unknown) else "none"
    return (
        f"the workload's decodes read contexts {_times(ratio)} than the benchmark's "
        f"({workload:,.0f} against {bench:,.0f} tokens), and one request mix with no roofline "
        f"prior ({prior}) cannot tell the cost of reading context from the cost of a decoding "
        "request: no capacity is carried to this workload (a benchmark at two prompt lengths "
        f"{CONTEXT_SPREAD:g}× apart tells them apart)"
    )


def _carried_capacity(
    model: ServingModel,
    drawn: RequestSample,
    slo: Slo,
    *,
    kv_tokens: int,
    kv_source: str,
    peak_rate_rps: float,
    config: CapacityConfig,
    fleet_cache: CacheSource | None,
    measured_on_workload: bool,
) -> tuple[SettledFleet, CapacitySearch | Unknown, str | None]:
    """The capacity ``model`` carries to the sampled workload: withheld when the model does not
    reproduce its own benchmark (unless it was fitted on this very workload's traffic), the
    fleet's cache to a fixed point, then withheld when it rests on a prefill budget the
    benchmark does not pin. Returns the settled fleet, the capacity and what the budget's
    sensitivity says (None: nothing)."""
    unidentified = None if measured_on_workload else unidentified_context(model, drawn)
    withheld = (
        # A model that does not reproduce its own benchmark carries no capacity anywhere.
        f"{model.self_check.reason}: no capacity is carried to this workload"
        if not model.self_check.passed and not measured_on_workload
        else unidentified
    )
    settled = (
        SettledFleet(
            Unknown(
                reason=f"{withheld}; benchmark this deployment on your own traffic "
                "(enginefit loadtest)"
            ),
            drawn,
            None,
            None,
        )
        if withheld is not None
        else settle_fleet(
            model.coefficients,
            drawn,
            slo,
            limits=model.limits,
            kv_tokens=kv_tokens,
            kv_source=kv_source,
            peak_rate_rps=peak_rate_rps,
            config=config,
            cache=fleet_cache,
        )
        if kv_tokens > 0
        else SettledFleet(Unknown(reason=f"no KV cache: {kv_source}"), drawn, None, None)
    )
    found: CapacitySearch | Unknown = settled.found
    budget_note: str | None = None
    if not isinstance(found, Unknown):
        moved = budget_sensitivity(model, settled.sample, slo, found, kv_tokens, config)
        if isinstance(moved, Unknown):
            found = moved
        else:
            budget_note = moved
    return settled, found, budget_note


def predicted_capacity(
    model: ServingModel | Unknown,
    sample: RequestSample,
    slo: Slo,
    *,
    kv_tokens: int,
    kv_source: str,
    peak_rate_rps: float,
    config: CapacityConfig,
    fleet_cache: CacheSource | None,
) -> float | Unknown:
    """The capacity per replica the product would report for the sampled workload from
    ``model`` alone (one fitted without the workload's own traffic): :func:`carry_to_workload`'s
    own figure, its self-check, fleet's cache and prefill budget applied, without the band,
    cost and sensitivity it goes on to compute."""
    if isinstance(model, Unknown):
        return model
    found = _carried_capacity(
        model,
        sample,
        slo,
        kv_tokens=kv_tokens,
        kv_source=kv_source,
        peak_rate_rps=peak_rate_rps,
        config=config,
        fleet_cache=fleet_cache,
        measured_on_workload=False,
    )[1]
    return found if isinstance(found, Unknown) else found.rate_rps


def prediction_check(
    predicted: float | Unknown,
    measured: float | Unknown,
    *,
    fitted_from: Sequence[str],
    measured_from: str,
) -> PredictionCheck | Unknown:
    """Predicted against measured: signed error = predicted ÷ measured − 1; ``Unknown`` naming
    each side that is missing."""
    missing = [
        f"{side}: {value.reason}"
        for side, value in (("predicted", predicted), ("measured", measured))
        if isinstance(value, Unknown)
    ]
    if missing:
        return Unknown(reason="; ".join(missing))
    assert not isinstance(predicted, Unknown) and not isinstance(measured, Unknown)
    if measured <= 0:
        return Unknown(reason=f"measured: {measured_from} gives no positive capacity")
    return PredictionCheck(
        predicted_rps=predicted,
        measured_rps=measured,
        error=predicted / measured - 1.0,
        fitted_from=list(fitted_from),
        measured_from=measured_from,
    )


def budget_sensitivity(
    model: ServingModel,
    sample: RequestSample,
    slo: Slo,
    found: CapacitySearch,
    kv_tokens: int,
    config: CapacityConfig,
) -> str | Unknown | None:
    """How the capacity moves over the prefill budgets the benchmark cannot tell apart (the
    fit's ``budget_range``; with no upper end, up to the budget the model runs with): None when
    the budget is stated or pinned; ``Unknown`` when it moves more than
    ``BUDGET_SENSITIVITY``, since the capacity then rests on a limit nobody stated."""
    limits = model.limits
    if limits.budget_stated() or limits.budget_range is None:
        return None
    low, high = limits.budget_range
    ends = sorted(
        {b for b in (low, high if high is not None else limits.budget) if b != limits.budget}
    )
    if not ends:
        return None
    rates = {limits.budget: found.rate_rps}
    for budget in ends:
        edge = search_capacity(
            model.coefficients,
            sample,
            slo,
            limits=limits.moved(budget=budget),
            kv_tokens=kv_tokens,
            config=config,
        )
        rates[budget] = edge.rate_rps if not isinstance(edge, Unknown) else 0.0
    figures = ", ".join(
        f"{rate:.3g} req/s at {budget:,} tokens" if rate > 0 else f"none at {budget:,} tokens"
        for budget, rate in sorted(rates.items())
    )
    moved = max(abs(rate / found.rate_rps - 1.0) for rate in rates.values())
    span = f"{low:,}" + (f" to {high:,}" if high is not None else " tokens or more")
    if moved > BUDGET_SENSITIVITY:
        return Unknown(
            reason=f"this workload's capacity depends on the prefill budget, which the "
            f"benchmark does not pin (its p99 ITL fits a budget of {span}; the model's is "
            f"{limits.budget:,}, {limits.token_budget.source}): {figures}; state the "
            "deployment's max_num_batched_tokens in the manifest's engine_args"
        )
    return f"the same within {moved:.0%} over the prefill budgets the benchmark allows ({figures})"


def _placeholder_deployment(candidate: str, gpus: int | None) -> Deployment:
    """What an unfitted candidate is known as (its label; the GPU type is not carried)."""
    return Deployment(
        engine=candidate, engine_version=None, gpu_type="unknown", gpu_count=gpus or 0, model=None
    )


def workload_mix(
    workload: WorkloadRequests,
    config: CapacityConfig,
    *,
    peak_rate_rps: float,
    mean_rate_rps: float | None,
) -> WorkloadMix:
    return WorkloadMix(
        requests=int(workload.prompt.shape[0]),
        sampled=min(int(workload.prompt.shape[0]), config.sample_requests),
        prompt_tokens_mean=workload.prompt_mean,
        output_tokens_mean=workload.output_mean,
        cached_prompt_share=workload.cached_mean / workload.prompt_mean,
        peak_rate_rps=peak_rate_rps,
        mean_rate_rps=mean_rate_rps
        if mean_rate_rps is not None
        else Unknown(reason="the workload's mean rate is not known"),
    )


def capacity_result(
    workload_name: str,
    slo: Slo,
    workload: WorkloadRequests,
    candidates: Sequence[CandidateCapacity],
    config: CapacityConfig,
    *,
    peak_rate_rps: float,
    mean_rate_rps: float | None,
    sources: dict[str, str] | None = None,
    notes: Sequence[str] = (),
) -> CapacityResult:
    return CapacityResult(
        workload=workload_name,
        slo=slo,
        mix=workload_mix(
            workload, config, peak_rate_rps=peak_rate_rps, mean_rate_rps=mean_rate_rps
        ),
        settings=config.model_dump(mode="json"),
        candidates=list(candidates),
        sources=dict(sources or {}),
        notes=list(notes),
    )


def routing_value(
    model: ServingModel,
    workload: WorkloadRequests,
    *,
    cached_share_worse: float,
    cached_share_better: float,
    replicas: int,
    rate_rps: float,
    mean_rate_rps: float,
    gpu_hour_usd: float,
    kv_tokens: int,
    slo: Slo,
    config: CapacityConfig,
) -> RoutingValue:
    """What the better of two cached-token shares (e.g. cache-aware vs round-robin routing at
    ``replicas``) saves: prefill GPU time a month at the mean rate, in dollars, and the p95
    TTFT at ``rate_rps`` (the fleet's rate, split evenly over the replicas).

    Prefill GPU-hours saved a month = prefill s/token × (better − worse share) × prompt tokens a
    month ÷ 3600 × GPUs per replica: only the prefill term, not the whole step, so decoding time
    is not counted as saved."""
    if not 0.0 <= cached_share_worse <= cached_share_better < 1.0:
        raise ValueError("cached shares must satisfy 0 ≤ worse ≤ better < 1")
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    prompt_tokens_month = mean_rate_rps * workload.prompt_mean * SECONDS_PER_HOUR * HOURS_PER_MONTH
    saved_replica_s = (
        model.coefficients.prefill_s_per_token
        * (cached_share_better - cached_share_worse)
        * prompt_tokens_month
    )
    gpu_hours = saved_replica_s / SECONDS_PER_HOUR * model.deployment.gpu_count
    ttft: list[float | Unknown] = []
    for share in (cached_share_worse, cached_share_better):
        cached = np.floor(workload.prompt * share).astype(np.int64)
        drawn = sample_requests(workload.prompt, workload.output, cached, config)
        if int(np.max(drawn.prompt + drawn.output)) > kv_tokens:
            ttft.append(Unknown(reason="requests larger than the replica's KV cache"))
            continue
        run = simulate_at(
            model.coefficients,
            drawn,
            rate_rps / replicas,
            limits=model.limits,
            kv_tokens=kv_tokens,
        )
        stats = run_stats(
            run,
            drawn.output,
            rate_rps / replicas,
            config,
            slo.ttft_p95_ms,
            model.coefficients.request_latency_s,
        )
        ttft.append(stats.ttft_p95_ms)
    worse, better = ttft
    saved: float | Unknown = (
        worse - better
        if not isinstance(worse, Unknown) and not isinstance(better, Unknown)
        else Unknown(reason="p95 TTFT not simulated for both shares")
    )
    return RoutingValue(
        replicas=replicas,
        cached_share_worse=cached_share_worse,
        cached_share_better=cached_share_better,
        prefill_gpu_hours_saved_per_month=gpu_hours,
        monthly_usd_saved=gpu_hours * gpu_hour_usd,
        ttft_p95_ms_worse=worse,
        ttft_p95_ms_better=better,
        ttft_p95_ms_saved=saved,
        formula=(
            f"{model.coefficients.prefill_s_per_token * 1e3:.4g} ms/token × "
            f"({cached_share_better:.3f} − {cached_share_worse:.3f}) × "
            f"{prompt_tokens_month:,.0f} prompt tokens/month ÷ {SECONDS_PER_HOUR:g} × "
            f"{model.deployment.gpu_count} GPU = {gpu_hours:,.1f} GPU-h × ${gpu_hour_usd:g}"
        ),
    )
