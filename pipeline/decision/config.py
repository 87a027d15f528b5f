"""Settings of the decision stage: the team's ``requirements`` (what the traffic cannot tell)
and the ``decision`` rules' thresholds. Defaults and their meaning: ``pipeline/defaults.yaml``.

A requirement left empty or null is *unknown*, not assumed: the rule that needs it says so in
the rationale ("unknown: set requirements.hardware") instead of deciding on a guess.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Self

from pydantic import Field, Strict, model_validator

from pipeline.decision.catalog import Feature, HardwareTarget, Sources
from pipeline.settings import (
    ConfigPath,
    Fraction,
    NonNegative,
    PositiveInt,
    Section,
)

GIB = 2**30
Positive = Annotated[float, Field(gt=0)]


class KvCacheSizing(Section):
    """KV-cache tokens one replica holds (ENGINE_FACTS.md section 3, vLLM's sizing):

    budget per GPU = gpu_memory_gib × memory_utilization − overhead_gib − weights per GPU,
    weights per GPU = model_params_billion × 10⁹ × weight_bytes ÷ gpus_per_replica,
    KV bytes per token per GPU = 2 (K and V) × layers × max(kv_heads ÷ gpus_per_replica, 1)
    × head_dim × kv_bytes (KV heads split across tensor-parallel ranks, replicated when fewer),
    tokens per replica = ⌊budget per GPU ÷ KV bytes per token per GPU⌋.

    Llama-3.1-8B on one H100 (79.2 GiB visible, 0.92, 3 GiB overhead, 8.03 B params in BF16,
    32 layers, 8 KV heads of 128, BF16 KV) gives about 450k tokens, as ENGINE_FACTS.md does.
    """

    gpu_memory_gib: Positive
    gpus_per_replica: PositiveInt
    memory_utilization: Annotated[float, Field(gt=0, le=1)]
    overhead_gib: NonNegative
    model_params_billion: Positive
    weight_bytes: Positive
    layers: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    kv_bytes: Positive

    def weights_gib_per_gpu(self) -> float:
        return self.model_params_billion * 1e9 * self.weight_bytes / GIB / self.gpus_per_replica

    def budget_gib_per_gpu(self) -> float:
        return (
            self.gpu_memory_gib * self.memory_utilization
            - self.overhead_gib
            - self.weights_gib_per_gpu()
        )

    def kv_bytes_per_token_per_gpu(self) -> float:
        heads = max(self.kv_heads / self.gpus_per_replica, 1.0)
        return 2 * self.layers * heads * self.head_dim * self.kv_bytes

    def tokens_per_replica(self) -> int:
        return max(
            0, math.floor(self.budget_gib_per_gpu() * GIB / self.kv_bytes_per_token_per_gpu())
        )

    @model_validator(mode="after")
    def _weights_fit(self) -> Self:
        if self.budget_gib_per_gpu() <= 0:
            raise ValueError(
                f"the weights ({self.weights_gib_per_gpu():.1f} GiB per GPU) and overhead leave "
                "no memory for the KV cache: check gpu_memory_gib, gpus_per_replica and the model"
            )
        return self


class Requirements(Section):
    """What the team needs, which no trace or benchmark can say."""

    deployment: Literal["datacenter", "local"] | None
    hardware: Annotated[tuple[HardwareTarget, ...], Strict(False)]
    gpu_types: Sources
    fixed_sku: bool | None
    models: Sources
    model_changes_per_quarter: NonNegative | None
    features: Annotated[tuple[Feature, ...], Strict(False)]
    current_engine: str | None
    untrusted_tenants: bool | None
    cost_margin: Fraction
    engineer_week_usd: NonNegative | None
    migration_engineer_weeks: dict[str, NonNegative]
    kv_cache: KvCacheSizing | None


class DecisionConfig(Section):
    """Thresholds of the decision rules (each documented in defaults.yaml with its source)."""

    catalog: ConfigPath | None
    previous_record: ConfigPath | None
    prefix_window_tokens: PositiveInt
    prefix_heavy_share: Fraction
    prefix_light_share: Fraction
    routing_gain_min: Fraction
    payback_max_months: Positive
    high_volume_output_tokens_per_month: Positive
    trt_max_models: PositiveInt
    trt_max_changes_per_quarter: NonNegative
    long_context_tokens: PositiveInt
    catalog_max_age_days: PositiveInt

    @model_validator(mode="after")
    def _prefix_bands_ordered(self) -> Self:
        if self.prefix_light_share >= self.prefix_heavy_share:
            raise ValueError("prefix_light_share must be below prefix_heavy_share")
        return self
