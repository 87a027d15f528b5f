"""The ``shape`` section of ``enginefit.yaml`` (defaults and their documentation:
``pipeline/defaults.yaml``)."""

from __future__ import annotations

from typing import Annotated, Any

from pipeline.settings import Section, between
from pipeline.shape.facts import LatencyModel
from pipeline.thresholds import CONCURRENCY_HIGH_MIN, CONCURRENCY_LOW_MAX

# The latency model's sane ranges: a first token an hour away, a second per prompt token or a
# minute per output token describe no server (and larger values overflow the durations).
MAX_TTFT_BASE_MS = 3_600_000.0
MAX_TTFT_PER_PROMPT_TOKEN_MS = 1_000.0
MAX_TPOT_MS = 60_000.0
# p99/p50 of a length distribution: past a thousand the ratio flags nothing a person would.
MAX_LONG_TAIL_RATIO = 1_000.0


class LatencyModelConfig(Section):
    """The configured latency model; ``as_model`` gives the :class:`LatencyModel` it defines."""

    ttft_base_ms: Annotated[float, between(0, MAX_TTFT_BASE_MS)]
    ttft_per_prompt_token_ms: Annotated[float, between(0, MAX_TTFT_PER_PROMPT_TOKEN_MS)]
    tpot_ms: Annotated[float, between(0, MAX_TPOT_MS)]

    def as_model(self, source: str = "config") -> LatencyModel:
        return LatencyModel(
            ttft_base_ms=self.ttft_base_ms,
            ttft_per_prompt_token_ms=self.ttft_per_prompt_token_ms,
            tpot_ms=self.tpot_ms,
            source=source,
        )


# A count window is reported only when it spans at least this many timestamp quanta (and, on a
# quantised trace, is a whole multiple of the quantum): fewer would show the quantisation.
MIN_QUANTA_PER_WINDOW = 3.0
# Up to this many requests every shape figure is computed exactly from the whole table (today's
# outputs, byte for byte). Above it the table is read in chunks of ``CHUNK_ROWS`` consecutive
# rows: counts, sums, extremes, the concurrency sweep and the figures' data stay exact, and the
# percentiles come from a mergeable sketch within ``pipeline.shape.sketch.RELATIVE_ERROR``
# (docs/shape.md, "Large traces").
EXACT_MAX_REQUESTS = 20_000_000
CHUNK_ROWS = 2_000_000
# Most buckets in a downsampled time series (plots, concurrency.parquet): a page-wide plot.
PLOT_POINTS = 2000


class ShapeConfig(Section):
    """Settings of the workload-shape stage.

    ``latency_model``
        Duration estimate used for concurrency when a trace does not log ``e2e_ms``.
    ``long_tail_ratio``
        p99/p50 at or above which a length distribution counts as long-tailed ("p99 ≫ p50").
    """

    latency_model: LatencyModelConfig
    long_tail_ratio: Annotated[float, between(1, MAX_LONG_TAIL_RATIO, low_open=True)]

    @property
    def latency(self) -> LatencyModel:
        """The configured latency model (``source`` = ``config``)."""
        return self.latency_model.as_model()

    def recorded(self) -> dict[str, Any]:
        """The settings and the fixed thresholds the stage used, as its result records them."""
        return {
            **self.model_dump(mode="json"),
            "concurrency_high_min": CONCURRENCY_HIGH_MIN,
            "concurrency_low_max": CONCURRENCY_LOW_MAX,
            "min_quanta_per_window": MIN_QUANTA_PER_WINDOW,
            "plot_points": PLOT_POINTS,
        }


class RecordedShapeConfig(ShapeConfig):
    """What ``workload_shape.json`` records under ``config``: the settings, and the fixed
    thresholds the stage used (so a result read months later says what it was judged by)."""

    concurrency_high_min: float = CONCURRENCY_HIGH_MIN
    concurrency_low_max: float = CONCURRENCY_LOW_MAX
    min_quanta_per_window: float = MIN_QUANTA_PER_WINDOW
    plot_points: int = PLOT_POINTS
