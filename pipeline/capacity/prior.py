"""The roofline prior and the physical floors: what a step should cost, and what it cannot
cost less than, from the GPU's datasheet and the model's shape.

The prior is used only where the benchmark cannot separate the terms itself (docs/capacity.md,
"fit"):

* prefill is compute-bound: ≈ 2 × active parameters FLOPs per prompt token (the matrix
  multiplies), plus causal attention, 2 × full-attention layers × query heads × (query-key +
  value head width) FLOPs per (query, key) token pair (QKᵀ and the weighted sum of V), at the
  GPU's dense peak × ``PREFILL_FLOPS_UTILISATION`` (BF16, or the FP8 / INT8 peak, twice it,
  for weights of a byte or less);
* a decode step is memory-bound: every step reads the weights once (the step overhead) and each
  decoding request reads its context's KV cache (the context term), at the GPU's memory
  bandwidth × ``MEMORY_BANDWIDTH_UTILISATION``;
* a decoding request's own matrix-multiply work is one token's worth of prefill FLOPs.

The floors are the same reads and FLOPs at 100 % of the datasheet peaks, with the fewest bytes a
step can read (a mixture of experts: its active parameters only): no decode step is cheaper
than reading the weights and the batch's KV, no prefill faster than the GPU's peak FLOPs. A
decoding request's own matrix work has no floor of its own: under the weights' read it can be
hidden (a roofline step is the larger of compute and memory, not their sum).

Tensor parallelism over ``gpus`` divides all of it by ``gpus`` (communication ignored).

GPU figures are the vendors' datasheet numbers for dense BF16 (half the "with sparsity" figure
the datasheets headline), HBM bandwidth and memory, SXM/OAM form factors unless named
otherwise. The URL of each datasheet is kept with its row; a GPU not in the table is
``Unknown``, never a guess.
"""

from __future__ import annotations

import re

from pydantic import Field

from pipeline.unknown import ResultModel, Unknown

#: Model FLOPs utilisation assumed for prefill (large-batch matrix multiplies reach 40-60 % of
#: peak on H100-class GPUs in vLLM; the middle is taken).
PREFILL_FLOPS_UTILISATION = 0.5
#: Share of the datasheet HBM bandwidth a decode step's reads achieve.
MEMORY_BANDWIDTH_UTILISATION = 0.8
#: The FP8 (INT8 on the A100) dense peak over the BF16 one, on every GPU of the table.
LOW_PRECISION_SPEEDUP = 2.0


class GpuPeaks(ResultModel):
    """A GPU's datasheet peaks and memory."""

    name: str
    bf16_dense_tflops: float
    memory_bandwidth_tb_s: float
    memory_gib: float
    source_url: str

    def dense_tflops(self, weight_bytes: float) -> float:
        """The peak the matrix multiplies of weights this wide run at (FP8 / INT8 for a byte or
        less)."""
        return self.bf16_dense_tflops * (LOW_PRECISION_SPEEDUP if weight_bytes <= 1 else 1.0)


class ModelShape(ResultModel):
    """What the prior and the floors need to know about the served model (the figures of
    ``requirements.kv_cache``, ``pipeline.decision.config.KvCacheSizing``, or of the model table,
    ``pipeline/capacity/models.yaml``, whose keys these are)."""

    params_billion: float = Field(gt=0)
    weight_bytes: float = Field(gt=0)  # bytes per parameter (2 for BF16)
    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    kv_bytes: float = Field(gt=0)  # bytes per cached K or V element
    attention_heads: int | None = Field(default=None, gt=0)  # query heads (None: unknown)
    active_params_billion: float | None = Field(default=None, gt=0)  # mixture of experts
    full_attention_layers: int | None = Field(default=None, gt=0)  # the rest: sliding window
    kv_latent_dim: int | None = Field(default=None, gt=0)  # latent attention's cached width
    qk_head_dim: int | None = Field(default=None, gt=0)
    v_head_dim: int | None = Field(default=None, gt=0)
    source: str | None = None  # where the figures come from

    @property
    def active_params(self) -> float:
        """Parameters one token runs through (all of them for a dense model)."""
        return (self.active_params_billion or self.params_billion) * 1e9

    @property
    def attention_layers(self) -> int:
        return self.full_attention_layers or self.layers

    def kv_bytes_per_token(self) -> float:
        """KV bytes a token of context holds (and a decode reads) over the full-attention
        layers: latent attention caches one latent vector a layer, the rest K and V per KV
        head."""
        if self.kv_latent_dim is not None:
            return self.attention_layers * self.kv_latent_dim * self.kv_bytes
        return 2.0 * self.attention_layers * self.kv_heads * self.head_dim * self.kv_bytes

    def attention_flops_per_pair(self) -> float | None:
        """FLOPs of one (query, key) token pair of causal attention (None: query heads unknown)."""
        if self.attention_heads is None:
            return None
        width = (self.qk_head_dim or self.head_dim) + (self.v_head_dim or self.head_dim)
        return 2.0 * self.attention_layers * self.attention_heads * width

    def with_quantisation(self, weight_bytes: float | None, kv_bytes: float | None) -> ModelShape:
        """The same model served with other weight and KV widths (None: unchanged)."""
        return self.model_copy(
            update={
                "weight_bytes": weight_bytes or self.weight_bytes,
                "kv_bytes": kv_bytes or self.kv_bytes,
            }
        )


class StepFloors(ResultModel):
    """The least each step-model coefficient can physically be (seconds; module docstring)."""

    overhead_s: float
    prefill_s_per_token: float
    attention_s_per_pair: float | None  # None: the model's query heads are not known
    context_s_per_token: float
    description: str


class PriorStep(ResultModel):
    """Step-time coefficients from the roofline (seconds)."""

    overhead_s: float
    prefill_s_per_token: float
    attention_s_per_pair: float | None  # None: the model's query heads are not given
    decode_s_per_request: float
    context_s_per_token: float
    gpu: GpuPeaks
    description: str


_NVIDIA = "https://www.nvidia.com/en-us/data-center"
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
#: (pattern on the normalised GPU name, peaks). First match wins, so variants come first.
GPU_TABLE: tuple[tuple[str, GpuPeaks], ...] = tuple(
    (
        pattern,
        GpuPeaks(
            name=name,
            memory_gib=memory_gib,
            bf16_dense_tflops=tflops,
            memory_bandwidth_tb_s=tb_s,
            source_url=url,
        ),
    )
    for pattern, name, memory_gib, tflops, tb_s, url in (
        # pattern, name, memory GiB, dense BF16 TFLOPS, HBM TB/s, datasheet
        (r"H100(PCIE|PCI)", "H100 PCIe", 80, 756.0, 2.0, f"{_NVIDIA}/h100/"),
        (r"H100NVL", "H100 NVL", 94, 835.0, 3.9, f"{_NVIDIA}/h100/"),
        (r"H100", "H100 SXM", 80, 989.0, 3.35, f"{_NVIDIA}/h100/"),
        (r"H200", "H200 SXM", 141, 989.0, 4.8, f"{_NVIDIA}/h200/"),
        (r"A10040", "A100 40GB SXM", 40, 312.0, 1.555, f"{_NVIDIA}/a100/"),
        (r"A100", "A100 80GB SXM", 80, 312.0, 2.039, f"{_NVIDIA}/a100/"),
        (r"L40S", "L40S", 48, 362.05, 0.864, f"{_NVIDIA}/l40s/"),
        (r"L4(?!0)", "L4", 24, 121.0, 0.3, f"{_NVIDIA}/l4/"),
        (r"MI300X", "MI300X", 192, 1307.4, 5.3, _AMD_MI300X),
        (r"B200", "B200 (HGX B200, per GPU)", 180, 2250.0, 8.0, f"{_NVIDIA}/hgx/"),
    )
)


def _normalised(gpu_type: str) -> str:
    """``"NVIDIA H100-80GB HBM3"`` → ``"NVIDIAH10080GBHBM3"``: case and separators ignored."""
    return re.sub(r"[^A-Z0-9]", "", gpu_type.upper())


def gpu_peaks(gpu_type: str | None) -> GpuPeaks | Unknown:
    """The datasheet peaks of ``gpu_type`` (a manifest's ``gpu_type``), or ``Unknown``."""
    if not gpu_type:
        return Unknown(reason="no GPU type: the roofline prior needs the GPU's datasheet peaks")
    name = _normalised(gpu_type)
    for pattern, peaks in GPU_TABLE:
        if re.search(pattern, name):
            return peaks
    known = ", ".join(p.name for _, p in GPU_TABLE)
    return Unknown(
        reason=f"GPU {gpu_type!r} is not in the roofline table ({known}): no prior for it"
    )


NO_SHAPE = (
    "the model's size and KV layout are not given (requirements.kv_cache) and the model is not "
    "in the model table (pipeline/capacity/models.yaml)"
)


def roofline_prior(
    gpu_type: str | None, gpus: int, model: ModelShape | None
) -> PriorStep | Unknown:
    """Step-time coefficients the datasheet and the model's shape imply (module docstring)."""
    peaks = gpu_peaks(gpu_type)
    if isinstance(peaks, Unknown):
        return peaks
    if model is None:
        return Unknown(reason=f"{NO_SHAPE}: no roofline prior")
    flops_per_s = peaks.dense_tflops(model.weight_bytes) * 1e12 * PREFILL_FLOPS_UTILISATION * gpus
    bytes_per_s = peaks.memory_bandwidth_tb_s * 1e12 * MEMORY_BANDWIDTH_UTILISATION * gpus
    flops_per_token = 2.0 * model.active_params
    weight_bytes = model.params_billion * 1e9 * model.weight_bytes
    pair = model.attention_flops_per_pair()
    active = f", {model.active_params_billion:g} B active" if model.active_params_billion else ""
    return PriorStep(
        overhead_s=weight_bytes / bytes_per_s,
        prefill_s_per_token=flops_per_token / flops_per_s,
        attention_s_per_pair=None if pair is None else pair / flops_per_s,
        decode_s_per_request=flops_per_token / flops_per_s,
        context_s_per_token=model.kv_bytes_per_token() / bytes_per_s,
        gpu=peaks,
        description=(
            f"roofline on {gpus}× {peaks.name} ({peaks.dense_tflops(model.weight_bytes):g} "
            f"TFLOPS dense × {PREFILL_FLOPS_UTILISATION:g}, {peaks.memory_bandwidth_tb_s:g} TB/s "
            f"× {MEMORY_BANDWIDTH_UTILISATION:g}; {peaks.source_url}) for a "
            f"{model.params_billion:g} B-parameter model{active}"
        ),
    )


def physical_floors(
    gpu_type: str | None, gpus: int, model: ModelShape | None
) -> StepFloors | Unknown:
    """The least a step can cost (module docstring): the active weights and each context
    token's KV read at the full datasheet bandwidth, prefill's FLOPs at the full dense peak."""
    peaks = gpu_peaks(gpu_type)
    if isinstance(peaks, Unknown):
        return peaks
    if model is None:
        return Unknown(reason=f"{NO_SHAPE}: no physical floor")
    flops_per_s = peaks.dense_tflops(model.weight_bytes) * 1e12 * gpus
    bytes_per_s = peaks.memory_bandwidth_tb_s * 1e12 * gpus
    pair = model.attention_flops_per_pair()
    return StepFloors(
        overhead_s=model.active_params * model.weight_bytes / bytes_per_s,
        prefill_s_per_token=2.0 * model.active_params / flops_per_s,
        attention_s_per_pair=None if pair is None else pair / flops_per_s,
        context_s_per_token=model.kv_bytes_per_token() / bytes_per_s,
        description=(
            f"{gpus}× {peaks.name} at its full datasheet peaks "
            f"({peaks.dense_tflops(model.weight_bytes):g} TFLOPS dense, "
            f"{peaks.memory_bandwidth_tb_s:g} TB/s; {peaks.source_url})"
        ),
    )
