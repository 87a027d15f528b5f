"""What the capacity core produces, as frozen pydantic models (``extra="forbid"``).

:class:`ServingModel` is the fitted step-time model of one benchmarked deployment with its error
on every point it was fitted on; :class:`CandidateCapacity` carries it to one workload (capacity
at the SLO, its band, how far the workload's mix is from the benchmark's, and the cost);
:class:`CapacityResult` is the document (``to_json`` / ``from_json`` round-trip). A figure the
input cannot support is a :class:`~pipeline.unknown.Unknown` with its reason, never 0.
"""

from __future__ import annotations

from typing import Any, Literal

import polars as pl
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from pipeline.capacity.limits import SchedulingLimits
from pipeline.capacity.prior import StepFloors
from pipeline.settings import versioned
from pipeline.unknown import ResultModel, Unknown

SCHEMA_VERSION: Literal[3] = 3
ContextBasis = Literal["fitted", "prior", "assumed_zero"]
CapacityBasis = Literal["measured", "transferred"]
ArrivalKind = Literal["trace", "gamma", "poisson"]


class Deployment(ResultModel):
    """One benchmarked deployment: engine × GPU × model × version × GPU count (+ label)."""

    engine: str
    engine_version: str | None
    gpu_type: str
    gpu_count: int
    model: str | None
    label: str | None = None
    backend: str | None = None  # the engine's serving backend (manifest ``backend``)

    def describe(self) -> str:
        version = f" {self.engine_version}" if self.engine_version else ""
        version += f" ({self.backend} backend)" if self.backend else ""
        label = f" [{self.label}]" if self.label else ""
        model = self.model or "unknown model"
        return f"{self.engine}{version} / {model} / {self.gpu_count}×{self.gpu_type}{label}"


class StepCoefficients(ResultModel):
    """``step_s = overhead_s + prefill_s_per_token·(uncached prefill tokens in the step)
    + attention_s_per_pair·Σ chunk·(prompt tokens before the chunk + chunk/2)
    + decode_s_per_request·(decoding requests) + context_s_per_token·(context tokens read)``."""

    overhead_s: float
    prefill_s_per_token: float
    attention_s_per_pair: float
    decode_s_per_request: float
    context_s_per_token: float
    #: Latency every request's first token carries outside the GPU's steps (HTTP, tokenising,
    #: scheduling; BLIS's per-request overhead α0): added to TTFT and E2E, costs no GPU time.
    request_latency_s: float = 0.0

    def scaled(self, factor: float) -> StepCoefficients:
        return StepCoefficients(
            overhead_s=self.overhead_s * factor,
            prefill_s_per_token=self.prefill_s_per_token * factor,
            attention_s_per_pair=self.attention_s_per_pair * factor,
            decode_s_per_request=self.decode_s_per_request * factor,
            context_s_per_token=self.context_s_per_token * factor,
            request_latency_s=self.request_latency_s * factor,
        )


class PointError(ResultModel):
    """Predicted (the fitted model replaying the point) against measured, at one load point.

    Latencies in ms; ``*_error`` = predicted ÷ measured − 1 (Unknown when not measured)."""

    point_id: str
    rate_rps: float
    requests: int
    replayed: bool  # True: the point's own requests (arrival times, lengths) were replayed
    measured: dict[str, float | Unknown]
    predicted: dict[str, float]
    error: dict[str, float | Unknown]


class CapacityCheck(ResultModel):
    """The sweep's measured SLO capacity bracket against the model's capacity at its mix."""

    measured_low_rps: float  # highest passing load
    measured_high_rps: float | None  # first failing load (None: the sweep never failed)
    predicted_rps: float | Unknown
    within_bracket: bool | None


class SelfCheck(ResultModel):
    """Whether the fitted model reproduces its own benchmark: every kept-up point below the
    measured capacity replayed within ``tolerance`` on p95 TTFT and p99 ITL, and the model's
    capacity at the benchmark's own mix inside the measured bracket (docs/capacity.md)."""

    passed: bool
    tolerance: float
    points_checked: int
    worst: str  # the worst statistic, in words
    worst_error: float | None  # predicted ÷ measured − 1 there
    reason: str | None  # why the model is not to be carried (None: passed)


class ServingModel(ResultModel):
    """The fitted serving model of one deployment (docs/capacity.md)."""

    deployment: Deployment
    coefficients: StepCoefficients
    limits: SchedulingLimits
    prefill_split_basis: Literal["fitted", "prior"]
    context_basis: ContextBasis
    attention_basis: Literal["prior", "assumed_zero"]
    points_used: int
    bench_prompt_tokens_mean: float
    bench_output_tokens_mean: float
    bench_prompt_tokens_range: tuple[float, float]
    bench_output_tokens_range: tuple[float, float]
    residual_spread: float  # relative RMS error of the per-point mean inter-token gap
    point_errors: list[PointError]
    capacity_check: CapacityCheck | None
    self_check: SelfCheck
    prior: str | Unknown  # what the roofline prior was (or why there was none)
    model_shape: str  # whose shape prices attention, the prior and the floors
    floors: StepFloors | Unknown
    #: Coefficients fitted below their physical floor and set to it: "name: fitted → floor".
    floored: list[str]
    notes: list[str]
    method: str


class TransferDistance(ResultModel):
    """How far the workload's request mix is from the one(s) the model was fitted on."""

    prompt_ratio: float  # workload mean prompt ÷ benchmark mean prompt
    output_ratio: float
    uncached_prompt_ratio: float  # workload mean uncached prompt ÷ benchmark mean prompt
    outside_fitted_range: bool
    far: bool
    description: str


class WorkloadCost(ResultModel):
    """Fleet and money for the workload's own mix (formulas in ``formula``)."""

    replicas: int
    gpus: int
    gpu_hour_usd: float
    headroom: float
    n_plus_one: bool
    monthly_cost_usd: float
    #: The capacity band carried through: replicas at its high end (fewer) and low end
    #: (more), and what each fleet costs a month.
    replicas_band: tuple[int, int]
    monthly_cost_band_usd: tuple[float, float]
    average_utilisation: float | Unknown  # mean rate ÷ (replicas × capacity)
    peak_utilisation: float
    prefill_share: float  # of the replica's busy time at capacity
    cached_context_share: float
    decode_share: float
    cost_per_1m_output_usd: float
    cost_per_1m_input_usd: float | Unknown
    cost_per_1m_cached_input_usd: float | Unknown
    all_in_cost_per_1m_output_usd: float  # every GPU-second at capacity ÷ output tokens
    all_in_cost_per_1m_output_band_usd: tuple[float, float]  # at the capacity band's ends
    fleet_cost_per_1m_output_usd: float | Unknown  # the sized fleet's bill ÷ output at mean rate
    formula: str


class Arrivals(ResultModel):
    """How the capacity search's sampled requests arrive (docs/capacity.md, "Arrivals"):
    ``trace`` replays the workload's own inter-arrival pattern in contiguous windows, ``gamma``
    draws Gamma gaps at ``cv``, ``poisson`` exponential ones; every rate tried scales the same
    times (common random numbers)."""

    kind: ArrivalKind
    cv: float | Unknown  # inter-arrival coefficient of variation (1 for Poisson)
    description: str


class FleetStep(ResultModel):
    """One pass of the fleet-size / cache fixed point: the cache replayed at ``replicas``, the
    capacity it gives, and the replicas that capacity needs at the peak. The first pass has
    ``replicas`` 0: no replay, every prompt cached at the share the simulation's scenarios
    found (where the iteration starts)."""

    replicas: int
    cached_share: float
    capacity_rps: float | Unknown
    replicas_needed: int | None


class FleetCache(ResultModel):
    """Which replay gave the per-request cached tokens the capacity was searched with."""

    replicas: int
    kv_tokens: int  # the replica's KV pool, also its prefix cache's size
    kv_source: str
    routing: str
    block_size: int
    cached_share: float  # cached ÷ prompt tokens of the workload in that replay
    description: str
    steps: list[FleetStep]
    settled: bool  # the replica count repeated (False: it alternated; the larger was kept)


class CapacityVariant(ResultModel):
    """The capacity with one input moved (the sensitivity of a candidate's capacity)."""

    key: Literal["poisson", "cached_minus", "cached_plus", "budget_half", "budget_double"]
    description: str
    capacity_rps: float | Unknown
    change: float | Unknown  # capacity ÷ the candidate's − 1


BindingKind = Literal["ttft_queueing", "prefill_budget", "itl", "kv_pool", "running_requests"]


class BindingLimit(ResultModel):
    """What stops a replica serving more of this workload at the SLO: the limit whose
    relaxation lets the first failing rate pass, else the SLO clause that fails there."""

    limit: BindingKind
    description: str


class PredictionCheck(ResultModel):
    """The serving model's capacity for this workload, fitted without the workload's own
    traffic, against the capacity a benchmark of that traffic measured at the SLO: how far off
    a transferred capacity was where the answer is known (docs/capacity.md, "Predicted against
    measured")."""

    predicted_rps: float  # per replica: the model fitted on ``fitted_from`` alone
    measured_rps: float  # per replica: the bench stage's SLO capacity of ``measured_from``
    error: float  # predicted ÷ measured − 1
    fitted_from: list[str]  # the bench candidates (sweeps at other mixes) the model was fitted on
    measured_from: str  # the bench candidate that replayed this workload's own traffic


class CandidateCapacity(ResultModel):
    """One deployment carried to one workload."""

    candidate: str
    deployment: Deployment
    serving_model: ServingModel | Unknown
    workload_capacity_rps: float | Unknown
    workload_capacity_band_rps: tuple[float, float] | Unknown
    #: Where the band comes from: the fit's residuals, and for a transferred capacity the
    #: validation error, combined (None: no band).
    band_basis: str | None = None
    capacity_basis: CapacityBasis
    capacity_method: str
    transfer: TransferDistance | Unknown
    provisional_reason: str | None
    cost: WorkloadCost | Unknown
    benchmark_cost_per_1m_output_usd: float | Unknown
    binding: BindingLimit | Unknown
    #: How the capacity moves over the prefill budgets the benchmark cannot tell apart (None:
    #: the budget is stated or pinned by the data, or it does not matter here).
    budget_sensitivity: str | None = None
    #: The bench stage's candidates (sweeps of this deployment) the model was fitted from.
    bench_candidates: list[str] = Field(default_factory=list)
    #: How the searched requests arrived, and where their cached tokens came from (None: the
    #: cached tokens given with the workload, no replay).
    arrivals: Arrivals | None = None
    fleet_cache: FleetCache | Unknown | None = None
    #: The capacity with burstiness, the cached share and the prefill budget moved.
    sensitivity: list[CapacityVariant] = Field(default_factory=list)
    #: Predicted against measured (None, and left out of the document: no deployment was
    #: benchmarked on this workload's own traffic, so there is nothing to check).
    prediction_check: PredictionCheck | Unknown | None = None

    def variant(self, key: str) -> CapacityVariant | None:
        return next((v for v in self.sensitivity if v.key == key), None)

    @model_serializer(mode="wrap")
    def _without_absent_check(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A document of a workload nobody load-tested stays as it was before the check existed.
        out: dict[str, Any] = handler(self)
        if self.prediction_check is None:
            out.pop("prediction_check", None)
        return out


class WorkloadMix(ResultModel):
    """The workload as the capacity search saw it."""

    requests: int
    sampled: int
    prompt_tokens_mean: float
    output_tokens_mean: float
    cached_prompt_share: float  # cached ÷ prompt tokens
    peak_rate_rps: float
    mean_rate_rps: float | Unknown


class Slo(ResultModel):
    """The limits the capacity search holds (the project's ``bench.slo``)."""

    ttft_p95_ms: float
    itl_p99_ms: float
    itl_definition: Literal["per-gap", "per-request"] = "per-gap"

    def describe(self) -> str:
        itl = "ITL" if self.itl_definition == "per-gap" else "TPOT"
        return f"p95 TTFT ≤ {self.ttft_p95_ms:g} ms, p99 {itl} ≤ {self.itl_p99_ms:g} ms"


class RoutingValue(ResultModel):
    """What the better of two cached-token shares saves, through the fitted model."""

    replicas: int
    cached_share_worse: float
    cached_share_better: float
    prefill_gpu_hours_saved_per_month: float
    monthly_usd_saved: float
    ttft_p95_ms_worse: float | Unknown
    ttft_p95_ms_better: float | Unknown
    ttft_p95_ms_saved: float | Unknown
    formula: str


class CapacityResult(ResultModel):
    """The capacity document for one workload."""

    schema_version: Literal[3] = SCHEMA_VERSION
    workload: str
    slo: Slo
    mix: WorkloadMix
    settings: dict[str, Any]
    candidates: list[CandidateCapacity]
    #: Where each input came from (facts, KV tokens, cached share, prices), in words.
    sources: dict[str, str] = Field(default_factory=dict)
    #: What the stage could not use, and why.
    notes: list[str] = Field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any, where: str = "capacity.json") -> CapacityResult:
        return versioned(cls, data, where, SCHEMA_VERSION, "capacity", "re-run the capacity stage")


def _known(value: float | Unknown) -> float | None:
    return None if isinstance(value, Unknown) else value


CANDIDATES_SCHEMA: dict[str, pl.DataType] = {
    "candidate": pl.String(),
    "engine": pl.String(),
    "engine_version": pl.String(),
    "model": pl.String(),
    "gpu_type": pl.String(),
    "gpu_count": pl.Int64(),
    "capacity_basis": pl.String(),
    "workload_capacity_rps": pl.Float64(),
    "capacity_band_low_rps": pl.Float64(),
    "capacity_band_high_rps": pl.Float64(),
    "capacity_unknown_reason": pl.String(),
    "provisional_reason": pl.String(),
    "replicas": pl.Int64(),
    "gpus": pl.Int64(),
    "gpu_hour_usd": pl.Float64(),
    "monthly_cost_usd": pl.Float64(),
    "replicas_band_low": pl.Int64(),
    "replicas_band_high": pl.Int64(),
    "monthly_cost_band_low_usd": pl.Float64(),
    "monthly_cost_band_high_usd": pl.Float64(),
    "average_utilisation": pl.Float64(),
    "peak_utilisation": pl.Float64(),
    "cost_per_1m_output_usd": pl.Float64(),
    "cost_per_1m_input_usd": pl.Float64(),
    "cost_per_1m_cached_input_usd": pl.Float64(),
    "all_in_cost_per_1m_output_usd": pl.Float64(),
    "all_in_cost_per_1m_output_band_low_usd": pl.Float64(),
    "all_in_cost_per_1m_output_band_high_usd": pl.Float64(),
    "fleet_cost_per_1m_output_usd": pl.Float64(),
    "benchmark_cost_per_1m_output_usd": pl.Float64(),
    "cost_unknown_reason": pl.String(),
    "binding_limit": pl.String(),
    "token_budget": pl.Int64(),
    "token_budget_source": pl.String(),
    "max_batch": pl.Int64(),
    "chunked_prefill": pl.Boolean(),
    "self_check_passed": pl.Boolean(),
}


def candidates_frame(result: CapacityResult) -> pl.DataFrame:
    """One row per candidate: capacity, band, fleet and prices (null where unknown; the reason
    in the ``*_unknown_reason`` columns and in capacity.json)."""
    rows: list[dict[str, Any]] = []
    for c in result.candidates:
        band = c.workload_capacity_band_rps
        cost = c.cost
        capacity = c.workload_capacity_rps
        row: dict[str, Any] = {
            "candidate": c.candidate,
            "engine": c.deployment.engine,
            "engine_version": c.deployment.engine_version,
            "model": c.deployment.model,
            "gpu_type": c.deployment.gpu_type,
            "gpu_count": c.deployment.gpu_count,
            "capacity_basis": c.capacity_basis,
            "workload_capacity_rps": _known(capacity),
            "capacity_band_low_rps": None if isinstance(band, Unknown) else band[0],
            "capacity_band_high_rps": None if isinstance(band, Unknown) else band[1],
            "capacity_unknown_reason": capacity.reason if isinstance(capacity, Unknown) else None,
            "provisional_reason": c.provisional_reason,
            "benchmark_cost_per_1m_output_usd": _known(c.benchmark_cost_per_1m_output_usd),
            "cost_unknown_reason": cost.reason if isinstance(cost, Unknown) else None,
            "binding_limit": None if isinstance(c.binding, Unknown) else c.binding.limit,
        }
        model = c.serving_model
        if isinstance(model, ServingModel):
            row |= {
                "token_budget": model.limits.budget,
                "token_budget_source": model.limits.token_budget.source,
                "max_batch": model.limits.batch,
                "chunked_prefill": model.limits.chunked,
                "self_check_passed": model.self_check.passed,
            }
        if isinstance(cost, WorkloadCost):
            row |= {
                "replicas": cost.replicas,
                "gpus": cost.gpus,
                "gpu_hour_usd": cost.gpu_hour_usd,
                "monthly_cost_usd": cost.monthly_cost_usd,
                "replicas_band_low": cost.replicas_band[0],
                "replicas_band_high": cost.replicas_band[1],
                "monthly_cost_band_low_usd": cost.monthly_cost_band_usd[0],
                "monthly_cost_band_high_usd": cost.monthly_cost_band_usd[1],
                "average_utilisation": _known(cost.average_utilisation),
                "peak_utilisation": cost.peak_utilisation,
                "cost_per_1m_output_usd": cost.cost_per_1m_output_usd,
                "cost_per_1m_input_usd": _known(cost.cost_per_1m_input_usd),
                "cost_per_1m_cached_input_usd": _known(cost.cost_per_1m_cached_input_usd),
                "all_in_cost_per_1m_output_usd": cost.all_in_cost_per_1m_output_usd,
                "all_in_cost_per_1m_output_band_low_usd": cost.all_in_cost_per_1m_output_band_usd[
                    0
                ],
                "all_in_cost_per_1m_output_band_high_usd": cost.all_in_cost_per_1m_output_band_usd[
                    1
                ],
                "fleet_cost_per_1m_output_usd": _known(cost.fleet_cost_per_1m_output_usd),
            }
        rows.append(row)
    return pl.DataFrame(rows, schema=CANDIDATES_SCHEMA)


MODEL_ERRORS_SCHEMA: dict[str, pl.DataType] = {
    "candidate": pl.String(),
    "point_id": pl.String(),
    "rate_rps": pl.Float64(),
    "requests": pl.Int64(),
    "replayed": pl.Boolean(),
    "statistic": pl.String(),
    "measured_ms": pl.Float64(),
    "predicted_ms": pl.Float64(),
    "error": pl.Float64(),
}


def model_errors_frame(result: CapacityResult) -> pl.DataFrame:
    """Every fitted model against every point it was fitted on, one row per statistic
    (``error`` = predicted ÷ measured − 1; null where the file lacks the statistic)."""
    rows: list[dict[str, Any]] = []
    for c in result.candidates:
        if not isinstance(c.serving_model, ServingModel):
            continue
        for point in c.serving_model.point_errors:
            for stat in sorted(point.predicted):
                rows.append(
                    {
                        "candidate": c.candidate,
                        "point_id": point.point_id,
                        "rate_rps": point.rate_rps,
                        "requests": point.requests,
                        "replayed": point.replayed,
                        "statistic": stat,
                        "measured_ms": _known(point.measured.get(stat, Unknown(reason="-"))),
                        "predicted_ms": point.predicted[stat],
                        "error": _known(point.error.get(stat, Unknown(reason="-"))),
                    }
                )
    return pl.DataFrame(rows, schema=MODEL_ERRORS_SCHEMA)
