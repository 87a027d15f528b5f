"""The capacity core's entry points: a fitted serving model carried to the workload's own mix,
the fleet and cost that follow, and routing priced through the model. Pure functions; no I/O.

Cost formulas (docs/capacity.md, "cost"; the arithmetic is :mod:`pipeline.costing`'s):

* replicas = ⌈peak rate ÷ (capacity × headroom)⌉ (+ 1 with N+1), at least 1;
  monthly cost = replicas × GPUs per replica × $/GPU-hour × hours a month;
* utilisation = rate ÷ (replicas × capacity), at the mean and at the peak rate;
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.capacity.binding import binding_limit
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.kernels import I64
from pipeline.capacity.prior import ModelShape
from pipeline.capacity.result import (
    CandidateCapacity,
    CapacityBasis,
    CapacityResult,
    Deployment,
    RoutingValue,
    ServingModel,
    Slo,
    TransferDistance,
    WorkloadCost,
    WorkloadMix,
)
from pipeline.capacity.search import (
    CapacitySearch,
    RequestSample,
    run_stats,
    sample_requests,
    search_capacity,
    simulate_at,
)
from pipeline.costing import (
    HOURS_PER_MONTH,
    SECONDS_PER_HOUR,
    monthly_usd,
    per_million,
    replicas_for,
)
from pipeline.unknown import Unknown

#: A capacity that moves more than this over the prefill budgets the benchmark cannot tell
#: apart is not given: it depends on a limit nobody stated.
BUDGET_SENSITIVITY = 0.10
CAPACITY_METHOD = (
    "simulated: Poisson arrivals of the workload's own sampled requests through the fitted "
    "step model (continuous batching, chunked prefill, KV-bounded batch), bisection on the "
    "rate for the largest one meeting the SLO with a queue that does not grow"
)


@dataclass(frozen=True)
class WorkloadRequests:
    """The workload's requests: prompt, output and prefix-cached prompt tokens per request."""

    prompt: I64
    output: I64
    cached: I64

    def __post_init__(self) -> None:
        n = self.prompt.shape[0]
        if self.output.shape[0] != n or self.cached.shape[0] != n:
            raise ValueError("prompt, output and cached token arrays differ in length")
        if n == 0:
            raise ValueError("the workload has no requests")

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
    ``output_tokens``) and either a per-request cached-token column (the replay's hits) or one
    cached share of every prompt (e.g. the replay's hit-token ratio for the recommended
    routing). Requests without a prompt or output length are left out."""
    if not 0.0 <= cached_share < 1.0:
        raise ValueError(f"cached_share must be in [0, 1), got {cached_share}")
    columns = ["prompt_tokens", "output_tokens", *([cached_column] if cached_column else [])]
    frame = requests.select(columns).drop_nulls(["prompt_tokens", "output_tokens"])
    prompt = frame.get_column("prompt_tokens").to_numpy().astype(np.int64)
    output = frame.get_column("output_tokens").to_numpy().astype(np.int64)
    if cached_column:
        cached = frame.get_column(cached_column).fill_null(0).to_numpy().astype(np.int64)
    else:
        cached = np.floor(prompt * cached_share).astype(np.int64)
    return WorkloadRequests(
        prompt=np.maximum(prompt, 1), output=np.maximum(output, 1), cached=cached
    )


def transfer_distance(
    model: ServingModel, workload: WorkloadRequests, far_ratio: float
) -> TransferDistance:
    """How far the workload's mix is from the benchmark's (ratios of means; range check)."""
    prompt_ratio = workload.prompt_mean / model.bench_prompt_tokens_mean
    output_ratio = workload.output_mean / model.bench_output_tokens_mean
    uncached_ratio = (workload.prompt_mean - workload.cached_mean) / model.bench_prompt_tokens_mean
    lo_p, hi_p = model.bench_prompt_tokens_range
    lo_o, hi_o = model.bench_output_tokens_range
    outside = not (lo_p <= workload.prompt_mean <= hi_p and lo_o <= workload.output_mean <= hi_o)
    far = any(
        r > far_ratio or r < 1.0 / far_ratio for r in (prompt_ratio, output_ratio, uncached_ratio)
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


def workload_cost(
    search: CapacitySearch,
    workload: WorkloadRequests,
    *,
    gpus_per_replica: int,
    gpu_hour_usd: float,
    peak_rate_rps: float,
    mean_rate_rps: float | None,
    config: CapacityConfig,
) -> WorkloadCost:
    """Fleet, monthly cost, utilisation and per-1M-token prices (module docstring)."""
    capacity = search.rate_rps
    replicas = replicas_for(peak_rate_rps, capacity, config.headroom, config.n_plus_one)
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
        average_utilisation=average,
        peak_utilisation=peak_rate_rps / (replicas * capacity),
        prefill_share=prefill_share,
        cached_context_share=cached_share,
        decode_share=decode_share,
        cost_per_1m_output_usd=per_million(hourly * decode_share, output_per_hour),
        cost_per_1m_input_usd=input_cost,
        cost_per_1m_cached_input_usd=cached_cost,
        all_in_cost_per_1m_output_usd=per_million(hourly, output_per_hour),
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
) -> CandidateCapacity:
    """Capacity at the SLO for the workload's own mix, its band, transfer distance and cost.

    ``kv_tokens``: the replica's KV-cache tokens (``requirements.kv_cache``). ``sample``: the
    workload's sampled requests when the caller shares one draw between candidates."""
    basis: CapacityBasis = "measured" if measured_on_workload else "transferred"
    bench_cost: float | Unknown = (
        benchmark_cost_per_1m_output_usd
        if benchmark_cost_per_1m_output_usd is not None
        else Unknown(reason="the bench stage gave no cost for this candidate")
    )
    if isinstance(model, Unknown):
        return CandidateCapacity(
            candidate=candidate,
            deployment=_placeholder_deployment(candidate, deployment_gpus),
            serving_model=model,
            workload_capacity_rps=model,
            workload_capacity_band_rps=model,
            capacity_basis=basis,
            capacity_method=CAPACITY_METHOD,
            transfer=model,
            provisional_reason=f"no serving model: {model.reason}",
            cost=model,
            benchmark_cost_per_1m_output_usd=bench_cost,
            binding=model,
        )
    drawn = sample or sample_requests(workload.prompt, workload.output, workload.cached, config)
    transfer = transfer_distance(model, workload, config.far_ratio)
    provisional = _provisional_reason(model, transfer)
    found: CapacitySearch | Unknown
    sensitivity: str | None = None
    if not model.self_check.passed and not measured_on_workload:
        found = Unknown(
            reason=f"{model.self_check.reason}: no capacity is carried to this workload; "
            "benchmark this deployment on your own traffic (enginefit loadtest)"
        )
    else:
        found = search_capacity(
            model.coefficients, drawn, slo, limits=model.limits, kv_tokens=kv_tokens, config=config
        )
        if not isinstance(found, Unknown):
            moved = budget_sensitivity(model, drawn, slo, found, kv_tokens, config)
            if isinstance(moved, Unknown):
                found = moved
            else:
                sensitivity = moved
    if isinstance(found, Unknown):
        return CandidateCapacity(
            candidate=candidate,
            deployment=model.deployment,
            serving_model=model,
            workload_capacity_rps=found,
            workload_capacity_band_rps=found,
            capacity_basis=basis,
            capacity_method=CAPACITY_METHOD,
            transfer=transfer,
            provisional_reason=provisional,
            cost=found,
            benchmark_cost_per_1m_output_usd=bench_cost,
            binding=found,
        )
    spread = min(max(model.residual_spread, config.min_band_spread), 0.5)
    band: list[float] = []
    for factor in (1.0 + spread, 1.0 - spread):  # slower steps → the band's low end
        edge = search_capacity(
            model.coefficients.scaled(factor),
            drawn,
            slo,
            limits=model.limits,
            kv_tokens=kv_tokens,
            config=config,
        )
        band.append(edge.rate_rps if not isinstance(edge, Unknown) else math.nan)
    low = band[0] if math.isfinite(band[0]) else found.rate_rps * (1 - spread)
    high = band[1] if math.isfinite(band[1]) else found.rate_rps * (1 + spread)
    cost: WorkloadCost | Unknown
    if gpu_hour_usd is None:
        cost = Unknown(reason=f"no $/GPU-hour for {model.deployment.gpu_type}")
    else:
        cost = workload_cost(
            found,
            workload,
            gpus_per_replica=model.deployment.gpu_count,
            gpu_hour_usd=gpu_hour_usd,
            peak_rate_rps=peak_rate_rps,
            mean_rate_rps=mean_rate_rps,
            config=config,
        )
    return CandidateCapacity(
        candidate=candidate,
        deployment=model.deployment,
        serving_model=model,
        workload_capacity_rps=found.rate_rps,
        workload_capacity_band_rps=(min(low, found.rate_rps), max(high, found.rate_rps)),
        capacity_basis=basis,
        capacity_method=CAPACITY_METHOD,
        transfer=transfer,
        provisional_reason=provisional,
        cost=cost,
        benchmark_cost_per_1m_output_usd=bench_cost,
        binding=binding_limit(model, drawn, found.rate_rps, slo, kv_tokens, config),
        budget_sensitivity=sensitivity,
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
        at = limits.model_copy(
            update={"token_budget": limits.token_budget.model_copy(update={"value": budget})}
        )
        edge = search_capacity(
            model.coefficients, sample, slo, limits=at, kv_tokens=kv_tokens, config=config
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
