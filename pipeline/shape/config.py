"""The ``shape`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from pipeline.settings import NonNegative, Section
from pipeline.shape.facts import LatencyModel


class LatencyModelConfig(Section):
    """The configured latency model; ``as_model`` gives the :class:`LatencyModel` it defines."""

    ttft_base_ms: NonNegative
    ttft_per_prompt_token_ms: NonNegative
    tpot_ms: NonNegative

    def as_model(self, source: str = "config") -> LatencyModel:
        return LatencyModel(
            ttft_base_ms=self.ttft_base_ms,
            ttft_per_prompt_token_ms=self.ttft_per_prompt_token_ms,
            tpot_ms=self.tpot_ms,
            source=source,
        )


class ShapeConfig(Section):
    """Settings of the workload-shape stage.

    ``latency_model``
        Duration estimate used for concurrency when a trace does not log ``e2e_ms``.
    ``long_tail_ratio``
        p99/p50 at or above which a length distribution counts as long-tailed ("p99 ≫ p50").
    ``concurrency_low_max`` / ``concurrency_high_min``
        DOMAIN.md's regime bounds: peak ≤ low → little to batch; peak ≥ high → vLLM/SGLang.
    ``min_quanta_per_window``
        A count window of w seconds is reported only when it spans at least this many
        timestamp quanta (and, on a quantised trace, is a whole multiple of the quantum).
    ``plot_points``
        Maximum number of buckets in the downsampled time series (plots, concurrency.parquet).
    """

    latency_model: LatencyModelConfig
    long_tail_ratio: Annotated[float, Field(gt=1)]
    concurrency_low_max: NonNegative
    concurrency_high_min: Annotated[float, Field(gt=0)]
    min_quanta_per_window: Annotated[float, Field(ge=1)]
    plot_points: Annotated[int, Field(ge=10)]

    @model_validator(mode="after")
    def _regimes_ordered(self) -> Self:
        if self.concurrency_high_min <= self.concurrency_low_max:
            raise ValueError(
                f"concurrency_high_min ({self.concurrency_high_min:g}) must exceed "
                f"concurrency_low_max ({self.concurrency_low_max:g})"
            )
        return self

    @property
    def latency(self) -> LatencyModel:
        """The configured latency model (``source`` = ``config``)."""
        return self.latency_model.as_model()
