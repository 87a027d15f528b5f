"""The ``shape`` section of ``enginefit.yaml``, validated into a frozen dataclass.

.. code-block:: yaml

    shape:
      latency_model: {ttft_base_ms: 50, ttft_per_prompt_token_ms: 0.05, tpot_ms: 30}
      long_tail_ratio: 4.0
      concurrency_low_max: 2
      concurrency_high_min: 10
      min_quanta_per_window: 3
      plot_points: 2000

Every key is optional; unknown keys are an error (a typo must not silently use a default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConfigError
from pipeline.facts import LatencyModel

_LATENCY_KEYS = ("ttft_base_ms", "ttft_per_prompt_token_ms", "tpot_ms")
_TOP_KEYS = (
    "latency_model",
    "long_tail_ratio",
    "concurrency_low_max",
    "concurrency_high_min",
    "min_quanta_per_window",
    "plot_points",
)


@dataclass(frozen=True)
class ShapeConfig:
    """Settings of the workload-shape stage (see the module docstring for the YAML form).

    ``latency_model``
        Duration estimate used for concurrency when a trace does not log ``e2e_ms``.
    ``long_tail_ratio``
        p99/p50 at or above which a length distribution counts as long-tailed ("p99 ≫ p50").
    ``concurrency_low_max`` / ``concurrency_high_min``
        DOMAIN.md's regime bounds: peak ≤ low → little to batch; peak ≥ high → vLLM/SGLang.
    ``min_quanta_per_window``
        A count window of w seconds is reported only when it spans at least this many
        timestamp quanta (or the timestamps sit exactly on a grid that divides w).
    ``plot_points``
        Maximum number of buckets in the downsampled time series (plots, concurrency.parquet).
    """

    latency_model: LatencyModel = field(default_factory=LatencyModel)
    long_tail_ratio: float = 4.0
    concurrency_low_max: float = 2.0
    concurrency_high_min: float = 10.0
    min_quanta_per_window: float = 3.0
    plot_points: int = 2000

    def as_dict(self) -> dict[str, Any]:
        return {
            "latency_model": self.latency_model.as_dict(),
            "long_tail_ratio": self.long_tail_ratio,
            "concurrency_low_max": self.concurrency_low_max,
            "concurrency_high_min": self.concurrency_high_min,
            "min_quanta_per_window": self.min_quanta_per_window,
            "plot_points": self.plot_points,
        }


def _number(value: Any, key: str, where: str, *, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: shape.{key} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"{where}: shape.{key} must be {bound}, got {value!r}")
    return float(value)


def parse_shape_config(section: dict[str, Any] | None, where: str = "<config>") -> ShapeConfig:
    """Validate the ``shape`` mapping (``config.section("shape")``) into a :class:`ShapeConfig`."""
    raw = dict(section or {})
    unknown = sorted(set(raw) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key shape.{unknown[0]} (known: {', '.join(_TOP_KEYS)})"
        )
    lm_raw = raw.get("latency_model") or {}
    if not isinstance(lm_raw, dict):
        raise ConfigError(f"{where}: shape.latency_model must be a mapping")
    lm_unknown = sorted(set(lm_raw) - set(_LATENCY_KEYS))
    if lm_unknown:
        raise ConfigError(
            f"{where}: unknown key shape.latency_model.{lm_unknown[0]} "
            f"(known: {', '.join(_LATENCY_KEYS)})"
        )
    default = LatencyModel()
    latency = LatencyModel(
        ttft_base_ms=_number(
            lm_raw.get("ttft_base_ms", default.ttft_base_ms),
            "latency_model.ttft_base_ms",
            where,
            minimum=0.0,
            strict=False,
        ),
        ttft_per_prompt_token_ms=_number(
            lm_raw.get("ttft_per_prompt_token_ms", default.ttft_per_prompt_token_ms),
            "latency_model.ttft_per_prompt_token_ms",
            where,
            minimum=0.0,
            strict=False,
        ),
        tpot_ms=_number(
            lm_raw.get("tpot_ms", default.tpot_ms),
            "latency_model.tpot_ms",
            where,
            minimum=0.0,
            strict=False,
        ),
        source="config",
    )
    low = _number(
        raw.get("concurrency_low_max", 2), "concurrency_low_max", where, minimum=0, strict=False
    )
    high = _number(
        raw.get("concurrency_high_min", 10), "concurrency_high_min", where, minimum=0, strict=True
    )
    if high <= low:
        raise ConfigError(
            f"{where}: shape.concurrency_high_min ({high:g}) must exceed "
            f"shape.concurrency_low_max ({low:g})"
        )
    points = raw.get("plot_points", 2000)
    if isinstance(points, bool) or not isinstance(points, int) or points < 10:
        raise ConfigError(f"{where}: shape.plot_points must be an integer >= 10, got {points!r}")
    return ShapeConfig(
        latency_model=latency,
        long_tail_ratio=_number(
            raw.get("long_tail_ratio", 4.0), "long_tail_ratio", where, minimum=1.0, strict=True
        ),
        concurrency_low_max=low,
        concurrency_high_min=high,
        min_quanta_per_window=_number(
            raw.get("min_quanta_per_window", 3.0),
            "min_quanta_per_window",
            where,
            minimum=1.0,
            strict=False,
        ),
        plot_points=points,
    )
