"""The roofline prior: what a step should cost from the GPU's datasheet and the model's size.

Used only where the benchmark cannot separate the terms itself (docs/capacity.md, "fit"):

* prefill is compute-bound: ≈ 2 × parameters FLOPs per prompt token (the matrix multiplies),
  plus causal attention, 4 × layers × hidden size FLOPs per (query, key) token pair (QKᵀ and
  the weighted sum of V, 2 × hidden each), at the GPU's dense BF16 peak ×
  ``PREFILL_FLOPS_UTILISATION``;
* a decode step is memory-bound: every step reads the weights once (the step overhead) and each
  decoding request reads its context's KV cache (the context term), at the GPU's memory
  bandwidth × ``MEMORY_BANDWIDTH_UTILISATION``;
* a decoding request's own matrix-multiply work is one token's worth of prefill FLOPs.

Tensor parallelism over ``gpus`` divides all of it by ``gpus`` (communication ignored).

GPU figures are the vendors' datasheet numbers for dense BF16 (half the "with sparsity" figure
the datasheets headline) and HBM bandwidth, SXM/OAM form factors unless named otherwise. The
URL of each datasheet is kept with its row; a GPU not in the table is ``Unknown``, never a guess.
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


class GpuPeaks(ResultModel):
    """A GPU's datasheet peaks."""

    name: str
    bf16_dense_tflops: float
    memory_bandwidth_tb_s: float
    source_url: str


class ModelShape(ResultModel):
    """What the prior needs to know about the served model (the same figures as
    ``requirements.kv_cache``: ``pipeline.decision.config.KvCacheSizing``)."""

    params_billion: float = Field(gt=0)
    weight_bytes: float = Field(gt=0)  # bytes per parameter (2 for BF16)
    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    kv_bytes: float = Field(gt=0)  # bytes per cached K or V element
    attention_heads: int | None = Field(default=None, gt=0)  # query heads (None: unknown)

    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes


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
#: (pattern on the normalised GPU name, peaks). First match wins, so variants come first.
GPU_TABLE: tuple[tuple[str, GpuPeaks], ...] = (
    (
        r"H100(PCIE|PCI)",
        GpuPeaks(
            name="H100 PCIe",
            bf16_dense_tflops=756.0,
            memory_bandwidth_tb_s=2.0,
            source_url=f"{_NVIDIA}/h100/",
        ),
    ),
    (
        r"H100NVL",
        GpuPeaks(
            name="H100 NVL",
            bf16_dense_tflops=835.0,
            memory_bandwidth_tb_s=3.9,
            source_url=f"{_NVIDIA}/h100/",
        ),
    ),
    (
        r"H100",
        GpuPeaks(
            name="H100 SXM",
            bf16_dense_tflops=989.0,
            memory_bandwidth_tb_s=3.35,
            source_url=f"{_NVIDIA}/h100/",
        ),
    ),
    (
        r"H200",
        GpuPeaks(
            name="H200 SXM",
            bf16_dense_tflops=989.0,
            memory_bandwidth_tb_s=4.8,
            source_url=f"{_NVIDIA}/h200/",
        ),
    ),
    (
        r"A10040",
        GpuPeaks(
            name="A100 40GB SXM",
            bf16_dense_tflops=312.0,
            memory_bandwidth_tb_s=1.555,
            source_url=f"{_NVIDIA}/a100/",
        ),
    ),
    (
        r"A100",
        GpuPeaks(
            name="A100 80GB SXM",
            bf16_dense_tflops=312.0,
            memory_bandwidth_tb_s=2.039,
            source_url=f"{_NVIDIA}/a100/",
        ),
    ),
    (
        r"L40S",
        GpuPeaks(
            name="L40S",
            bf16_dense_tflops=362.05,
            memory_bandwidth_tb_s=0.864,
            source_url=f"{_NVIDIA}/l40s/",
        ),
    ),
    (
        r"L4(?!0)",
        GpuPeaks(
            name="L4",
            bf16_dense_tflops=121.0,
            memory_bandwidth_tb_s=0.3,
            source_url=f"{_NVIDIA}/l4/",
        ),
    ),
    (
        r"MI300X",
        GpuPeaks(
            name="MI300X",
            bf16_dense_tflops=1307.4,
            memory_bandwidth_tb_s=5.3,
            source_url="https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        ),
    ),
    (
        r"B200",
        GpuPeaks(
            name="B200 (HGX B200, per GPU)",
            bf16_dense_tflops=2250.0,
            memory_bandwidth_tb_s=8.0,
            source_url=f"{_NVIDIA}/hgx/",
        ),
    ),
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


def roofline_prior(
    gpu_type: str | None, gpus: int, model: ModelShape | None
) -> PriorStep | Unknown:
    """Step-time coefficients the datasheet and the model's size imply (module docstring)."""
    peaks = gpu_peaks(gpu_type)
    if isinstance(peaks, Unknown):
        return peaks
    if model is None:
        return Unknown(
            reason="the model's size and KV layout are not given (requirements.kv_cache): "
            "no roofline prior"
        )
    flops_per_s = peaks.bf16_dense_tflops * 1e12 * PREFILL_FLOPS_UTILISATION * gpus
    bytes_per_s = peaks.memory_bandwidth_tb_s * 1e12 * MEMORY_BANDWIDTH_UTILISATION * gpus
    flops_per_token = 2.0 * model.params_billion * 1e9
    weight_bytes = model.params_billion * 1e9 * model.weight_bytes
    return PriorStep(
        overhead_s=weight_bytes / bytes_per_s,
        prefill_s_per_token=flops_per_token / flops_per_s,
        attention_s_per_pair=(
            4.0 * model.layers * model.attention_heads * model.head_dim / flops_per_s
            if model.attention_heads is not None
            else None
        ),
        decode_s_per_request=flops_per_token / flops_per_s,
        context_s_per_token=model.kv_bytes_per_token() / bytes_per_s,
        gpu=peaks,
        description=(
            f"roofline on {gpus}× {peaks.name} ({peaks.bf16_dense_tflops:g} TFLOPS BF16 dense × "
            f"{PREFILL_FLOPS_UTILISATION:g}, {peaks.memory_bandwidth_tb_s:g} TB/s × "
            f"{MEMORY_BANDWIDTH_UTILISATION:g}; {peaks.source_url}) for a "
            f"{model.params_billion:g} B-parameter model"
        ),
    )
