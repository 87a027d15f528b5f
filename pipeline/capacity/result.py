"""What the capacity core produces, as frozen pydantic models (``extra="forbid"``).

:class:`ServingModel` is the fitted step-time model of one benchmarked deployment with its error
on every point it was fitted on; :class:`CandidateCapacity` carries it to one workload (capacity
at the SLO, its band, how far the workload's mix is from the benchmark's, and the cost);
:class:`CapacityResult` is the document (``to_json`` / ``from_json`` round-trip). A figure the
input cannot support is a :class:`~pipeline.unknown.Unknown` with its reason, never 0.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.errors import InputFormatError
from pipeline.settings import validation_message
from pipeline.unknown import Unknown

SCHEMA_VERSION: Literal[1] = 1
SplitBasis = Literal["fitted", "prior"]
ContextBasis = Literal["fitted", "prior", "assumed_zero"]
CapacityBasis = Literal["measured", "transferred"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Deployment(_Model):
    """One benchmarked deployment: engine × GPU × model × version × GPU count (+ label)."""

    engine: str
    engine_version: str | None
    gpu_type: str
    gpu_count: int
    model: str | None
    label: str | None = None

    def describe(self) -> str:
        version = f" {self.engine_version}" if self.engine_version else ""
        label = f" [{self.label}]" if self.label else ""
        model = self.model or "unknown model"
        return f"{self.engine}{version} / {model} / {self.gpu_count}×{self.gpu_type}{label}"


class StepCoefficients(_Model):
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


class PointError(_Model):
    """Predicted (the fitted model replaying the point) against measured, at one load point.

    Latencies in ms; ``*_error`` = predicted ÷ measured − 1 (Unknown when not measured)."""

    point_id: str
    rate_rps: float
    requests: int
    replayed: bool  # True: the point's own requests (arrival times, lengths) were replayed
    measured: dict[str, float | Unknown]
    predicted: dict[str, float]
    error: dict[str, float | Unknown]


class CapacityCheck(_Model):
    """The sweep's measured SLO capacity bracket against the model's capacity at its mix."""

    measured_low_rps: float  # highest passing load
    measured_high_rps: float | None  # first failing load (None: the sweep never failed)
    predicted_rps: float | Unknown
    within_bracket: bool | None


class ServingModel(_Model):
    """The fitted serving model of one deployment (docs/capacity.md)."""

    deployment: Deployment
    coefficients: StepCoefficients
    token_budget: int
    max_batch: int
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
    prior: str | Unknown  # what the roofline prior was (or why there was none)
    notes: list[str]
    method: str


class TransferDistance(_Model):
    """How far the workload's request mix is from the one(s) the model was fitted on."""

    prompt_ratio: float  # workload mean prompt ÷ benchmark mean prompt
    output_ratio: float
    uncached_prompt_ratio: float  # workload mean uncached prompt ÷ benchmark mean prompt
    outside_fitted_range: bool
    far: bool
    description: str


class WorkloadCost(_Model):
    """Fleet and money for the workload's own mix (formulas in ``formula``)."""

    replicas: int
    gpus: int
    gpu_hour_usd: float
    headroom: float
    n_plus_one: bool
    monthly_cost_usd: float
    average_utilisation: float | Unknown  # mean rate ÷ (replicas × capacity)
    peak_utilisation: float
    prefill_share: float  # of the replica's busy time at capacity
    cached_context_share: float
    decode_share: float
    cost_per_1m_output_usd: float
    cost_per_1m_input_usd: float | Unknown
    cost_per_1m_cached_input_usd: float | Unknown
    all_in_cost_per_1m_output_usd: float  # every GPU-second at capacity ÷ output tokens
    fleet_cost_per_1m_output_usd: float | Unknown  # the sized fleet's bill ÷ output at mean rate
    formula: str


class CandidateCapacity(_Model):
    """One deployment carried to one workload."""

    candidate: str
    deployment: Deployment
    serving_model: ServingModel | Unknown
    workload_capacity_rps: float | Unknown
    workload_capacity_band_rps: tuple[float, float] | Unknown
    capacity_basis: CapacityBasis
    capacity_method: str
    transfer: TransferDistance | Unknown
    provisional_reason: str | None
    cost: WorkloadCost | Unknown
    benchmark_cost_per_1m_output_usd: float | Unknown


class WorkloadMix(_Model):
    """The workload as the capacity search saw it."""

    requests: int
    sampled: int
    prompt_tokens_mean: float
    output_tokens_mean: float
    cached_prompt_share: float  # cached ÷ prompt tokens
    peak_rate_rps: float
    mean_rate_rps: float | Unknown


class Slo(_Model):
    """The limits the capacity search holds (the project's ``bench.slo``)."""

    ttft_p95_ms: float
    itl_p99_ms: float
    itl_definition: Literal["per-gap", "per-request"] = "per-gap"

    def describe(self) -> str:
        itl = "ITL" if self.itl_definition == "per-gap" else "TPOT"
        return f"p95 TTFT ≤ {self.ttft_p95_ms:g} ms, p99 {itl} ≤ {self.itl_p99_ms:g} ms"


class RoutingValue(_Model):
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


class CapacityResult(_Model):
    """The capacity document for one workload."""

    schema_version: Literal[1] = SCHEMA_VERSION
    workload: str
    slo: Slo
    mix: WorkloadMix
    settings: dict[str, Any]
    candidates: list[CandidateCapacity]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any, where: str = "capacity.json") -> CapacityResult:
        if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
            raise InputFormatError(
                f"{where}: capacity schema_version {data.get('schema_version')!r} is not "
                f"{SCHEMA_VERSION}; re-run the capacity stage with this version"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InputFormatError(validation_message(exc, cls, where)) from exc
