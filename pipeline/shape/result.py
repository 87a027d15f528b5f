"""What the shape stage produces: the metrics document, the facts later stages read, and the
frames behind the plots.

``metrics`` is ``workload_shape.json`` (keys in ``docs/shape.md``); it round-trips through JSON
(:meth:`ShapeResult.to_json` / :meth:`ShapeResult.from_json`), and the typed views other stages
read (:attr:`facts`, :attr:`findings`) are derived from it, so a result read back from disk is
the same result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline.shape.arrivals import WINDOWS_S, window_label
from pipeline.shape.facts import LatencyModel, Percentiles, WorkloadFacts
from pipeline.shape.findings import Finding

_NAN_PERCENTILES = Percentiles(p50=math.nan, p90=math.nan, p95=math.nan, p99=math.nan, max=math.nan)


@dataclass(frozen=True)
class ShapePlotData:
    """What the figures draw (computed with the metrics; not persisted on its own)."""

    length_cdfs: dict[str, pl.DataFrame]  # "prompt"/"output" → value, share
    arrival_series: pl.DataFrame  # bucket_start, requests
    arrival_bucket_s: float


@dataclass(frozen=True)
class ShapeResult:
    metrics: dict[str, Any]
    concurrency_series: pl.DataFrame
    plots: ShapePlotData | None = None

    def to_json(self) -> dict[str, Any]:
        return self.metrics

    @classmethod
    def from_json(
        cls, metrics: dict[str, Any], concurrency_series: pl.DataFrame | None = None
    ) -> ShapeResult:
        series = concurrency_series if concurrency_series is not None else pl.DataFrame()
        return cls(metrics=metrics, concurrency_series=series)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding(**f) for f in self.metrics["findings"])

    @property
    def facts(self) -> WorkloadFacts:
        """The numbers later stages read (unsupported rate windows left out; NaN = unknown)."""
        m = self.metrics
        arrivals = m["arrivals"]
        peaks = {
            window_label(w): float(arrivals["windows"][window_label(w)]["peak_rate_rps"])
            for w in WINDOWS_S
            if arrivals["windows"][window_label(w)]["supported"]
        }
        conc = m["concurrency"]
        latency = conc["latency_model"]
        tenants = m["tenants"]
        return WorkloadFacts(
            requests=int(m["requests"]),
            span_s=float(arrivals["span_s"]),
            mean_rate_rps=_nan_if_none(arrivals["mean_rate_rps"]),
            peak_rate_rps=peaks,
            prompt_tokens=_percentiles(m["lengths"]["prompt_tokens"]),
            output_tokens=_percentiles(m["lengths"]["output_tokens"]),
            peak_concurrency=float(conc["peak"]),
            peak_concurrency_estimated=bool(conc["estimated"]),
            latency_model=LatencyModel(**latency) if latency else None,
            tenants=int(tenants["distinct"]) if tenants["logged"] else None,
            models=tuple(sorted(str(r["value"]) for r in m["models"]["top"])),
        )


def _percentiles(dist: dict[str, Any]) -> Percentiles:
    """Percentiles of a ``distribution`` dict; all NaN when the column was never logged."""
    if not dist["count"]:
        return _NAN_PERCENTILES
    return Percentiles(*(float(dist[k]) for k in ("p50", "p90", "p95", "p99", "max")))


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
