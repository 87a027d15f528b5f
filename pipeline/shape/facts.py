"""Small value types shared between stages, so no stage imports another's internals.

``WorkloadFacts`` is what the workload-shape stage hands to the benchmark join and the decision:
the handful of numbers that place a workload on the axes of
docs/decision-rules.md. ``LatencyModel`` estimates a
request's duration when the trace does not log one (no public trace does).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl


@dataclass(frozen=True)
class LatencyModel:
    """Duration ≈ TTFT(prompt) + (output tokens − 1) × TPOT.

    TTFT(prompt) = ``ttft_base_ms + ttft_per_prompt_token_ms × prompt_tokens``; the first token
    arrives with the TTFT and TPOT is the time per token after it, as benchmarks measure it
    (``(e2e − ttft) / (output tokens − 1)``), so a one-token answer takes the TTFT. Every figure
    derived from it is an estimate and must be labelled with these parameters and ``source``
    (``config`` now; ``benchmark:<engine>`` once fitted from joined benchmark results).
    """

    ttft_base_ms: float
    ttft_per_prompt_token_ms: float
    tpot_ms: float
    source: str = "config"

    def duration_ms_expr(
        self, prompt: str = "prompt_tokens", output: str = "output_tokens"
    ) -> pl.Expr:
        """Estimated end-to-end duration in ms; a null output count counts as no tokens."""
        after_first = (pl.col(output).fill_null(0).cast(pl.Float64) - 1.0).clip(lower_bound=0.0)
        return (
            self.ttft_base_ms
            + self.ttft_per_prompt_token_ms * pl.col(prompt).cast(pl.Float64)
            + self.tpot_ms * after_first
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @property
    def tail_ratio(self) -> float:
        """p99 / p50 (inf when p50 is 0 and p99 is not)."""
        if self.p50 == 0:
            return 0.0 if self.p99 == 0 else float("inf")
        return self.p99 / self.p50


@dataclass(frozen=True)
class WorkloadFacts:
    """The numbers of a workload that the benchmark join and the decision read.

    ``shared_prefix_ratio`` maps a window W in tokens to the share of requests whose first W
    tokens are shared with another request (docs/decision-rules.md#prefix-sharing); empty when the trace
    has no content.
    ``peak_concurrency_estimated`` is True when durations came from ``latency_model``.
    """

    requests: int
    span_s: float
    mean_rate_rps: float
    peak_rate_rps: dict[str, float]  # window label ("1s", "10s", "60s") -> peak requests/s
    prompt_tokens: Percentiles
    output_tokens: Percentiles
    peak_concurrency: float
    peak_concurrency_estimated: bool
    latency_model: LatencyModel | None = None
    shared_prefix_ratio: dict[int, float] = field(default_factory=dict)
    tenants: int | None = None
    models: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
