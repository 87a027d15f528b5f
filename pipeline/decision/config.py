"""Settings of the decision stage: the team's ``requirements`` (what the traffic cannot tell),
the ``decision`` section, and the rules' fixed thresholds (constants, each explained in
docs/decision-rules.md; not a team's). Defaults and their meaning: ``pipeline/defaults.yaml``.

A requirement left empty or null is *unknown*, not assumed: the rule that needs it says so in
the rationale ("unknown: set requirements.hardware") instead of deciding on a guess.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Self

from pydantic import Field, Strict, model_validator

from pipeline.capacity.config import ReplicaMemory, ServedModel
from pipeline.capacity.prior import ModelShape
from pipeline.decision.catalog import (
    CudaVersion,
    Feature,
    Gateway,
    HardwareTarget,
    Orchestrator,
    Sources,
)
from pipeline.settings import (
    ConfigPath,
    Fraction,
    Section,
    between,
)

GIB = 2**30
# The sane ranges of the sizing's inputs: past them no GPU or model exists, and the token count
# they give would overflow (4 TiB of memory over the narrowest KV entry is still ~10^13 tokens,
# inside the simulation's MAX_CACHE_TOKENS).
MAX_GPU_MEMORY_GIB = 4_096.0
MAX_GPUS_PER_REPLICA = 1_024
MAX_MODEL_PARAMS_BILLION = 100_000.0
# Bytes a weight or a KV entry takes: 1/8 (1-bit) to 8 (FP64).
MIN_ELEMENT_BYTES = 0.125
MAX_ELEMENT_BYTES = 8.0
MAX_LAYERS_OR_HEADS = 10_000
MAX_HEAD_DIM = 65_536
ElementBytes = Annotated[float, between(MIN_ELEMENT_BYTES, MAX_ELEMENT_BYTES)]
LayersOrHeads = Annotated[int, between(1, MAX_LAYERS_OR_HEADS)]
# The team's figures: a thousand model changes a quarter is ten a day; an engineer-week past
# $1M or a migration, revalidation or payback past ten years is a typo.
MAX_MODEL_CHANGES_PER_QUARTER = 1_000.0
MAX_ENGINEER_WEEK_USD = 1_000_000.0
MAX_WEEKS = 520.0
MAX_PAYBACK_MONTHS = 120.0
ModelChanges = Annotated[float, between(0, MAX_MODEL_CHANGES_PER_QUARTER)]
Weeks = Annotated[float, between(0, MAX_WEEKS)]


class KvCacheSizing(Section):
    """KV-cache tokens one replica holds (docs/decision-rules.md#kv-cache-sizing, vLLM's sizing):

    budget per GPU = gpu_memory_gib × memory_utilization − overhead_gib − weights per GPU,
    weights per GPU = model_params_billion × 10⁹ × weight_bytes ÷ gpus_per_replica,
    KV bytes per token per GPU = 2 (K and V) × layers × max(kv_heads ÷ gpus_per_replica, 1)
    × head_dim × kv_bytes (KV heads split across tensor-parallel ranks, replicated when fewer),
    tokens per replica = ⌊budget per GPU ÷ KV bytes per token per GPU⌋.

    Llama-3.1-8B on one H100 (79.2 GiB visible, 0.92, 3 GiB overhead, 8.03 B params in BF16,
    32 layers, 8 KV heads of 128, BF16 KV) gives about 450k tokens.
    """

    gpu_memory_gib: Annotated[float, between(0, MAX_GPU_MEMORY_GIB, low_open=True)]
    gpus_per_replica: Annotated[int, between(1, MAX_GPUS_PER_REPLICA)]
    memory_utilization: Annotated[float, Field(gt=0, le=1)]
    overhead_gib: Annotated[float, between(0, MAX_GPU_MEMORY_GIB)]
    model_params_billion: Annotated[float, between(0, MAX_MODEL_PARAMS_BILLION, low_open=True)]
    weight_bytes: ElementBytes
    layers: LayersOrHeads
    kv_heads: LayersOrHeads
    head_dim: Annotated[int, between(1, MAX_HEAD_DIM)]
    kv_bytes: ElementBytes
    # Query heads (optional): the capacity stage's roofline prior prices prefill attention.
    attention_heads: LayersOrHeads | None = None

    def weights_gib_per_gpu(self, weight_bytes: float | None = None) -> float:
        """Weights per GPU at ``weight_bytes`` a parameter (default: the configured width)."""
        width = self.weight_bytes if weight_bytes is None else weight_bytes
        return self.model_params_billion * 1e9 * width / GIB / self.gpus_per_replica

    def usable_gib_per_gpu(self) -> float:
        """Memory the engine may use per GPU, less its overhead: weights and KV cache share it."""
        return self.gpu_memory_gib * self.memory_utilization - self.overhead_gib

    def budget_gib_per_gpu(self) -> float:
        return self.usable_gib_per_gpu() - self.weights_gib_per_gpu()

    def kv_bytes_per_token_per_gpu(self) -> float:
        heads = max(self.kv_heads / self.gpus_per_replica, 1.0)
        return 2 * self.layers * heads * self.head_dim * self.kv_bytes

    def tokens_per_replica(self) -> int:
        return max(
            0, math.floor(self.budget_gib_per_gpu() * GIB / self.kv_bytes_per_token_per_gpu())
        )

    def model_shape(self) -> ModelShape:
        """The model's shape, as the capacity stage's roofline prior takes it."""
        return ModelShape(
            params_billion=self.model_params_billion,
            weight_bytes=self.weight_bytes,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            kv_bytes=self.kv_bytes,
            attention_heads=self.attention_heads,
        )

    @model_validator(mode="after")
    def _weights_fit(self) -> Self:
        if self.budget_gib_per_gpu() <= 0:
            raise ValueError(
                f"the weights ({self.weights_gib_per_gpu():.1f} GiB per GPU) and overhead leave "
                "no memory for the KV cache: check gpu_memory_gib, gpus_per_replica and the model"
            )
        return self


class Platform(Section):
    """Where the team runs its serving fleet, which decides the routing layer (null: unknown,
    and the decision lists the layers that fit instead of choosing one)."""

    orchestrator: Orchestrator | None
    gateway: Gateway | None


class Requirements(Section):
    """What the team needs, which no trace or benchmark can say."""

    deployment: Literal["datacenter", "local"] | None
    hardware: Annotated[tuple[HardwareTarget, ...], Strict(False)]
    one_engine_across_fleet: bool
    gpu_types: Sources
    # The CUDA release the NVIDIA fleet's drivers support (12, 12.8, 13): an engine whose
    # current release needs a newer major release is excluded.
    cuda_version: CudaVersion | None
    fixed_sku: bool | None
    models: Sources
    model_changes_per_quarter: ModelChanges | None
    features: Annotated[tuple[Feature, ...], Strict(False)]
    current_engine: str | None
    untrusted_tenants: bool | None
    cost_margin: Fraction
    engineer_week_usd: Annotated[float, between(0, MAX_ENGINEER_WEEK_USD)] | None
    migration_engineer_weeks: dict[str, Weeks]
    kv_cache: KvCacheSizing | None
    platform: Platform

    def served_model(self) -> ServedModel:
        """The models, KV-cache tokens and model shape the capacity stage takes."""
        kv = self.kv_cache
        if kv is None:
            return ServedModel(self.models)
        memory = ReplicaMemory(kv.gpu_memory_gib, kv.memory_utilization, kv.overhead_gib)
        return ServedModel(self.models, kv.tokens_per_replica(), kv.model_shape(), memory)


class DecisionConfig(Section):
    """The engine catalog, the previous quarter's record, and the payback the team accepts."""

    catalog: ConfigPath | None
    previous_record: ConfigPath | None
    # A switch whose migration takes longer than this to pay back is not recommended.
    payback_max_months: Annotated[float, between(0, MAX_PAYBACK_MONTHS, low_open=True)]
    # Weeks both engines run side by side after the migration work, while the new one is
    # revalidated; the payback counts the new fleet's bill over migration + these weeks.
    revalidation_weeks: Weeks
