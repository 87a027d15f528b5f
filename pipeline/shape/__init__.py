"""Workload shape: arrivals, lengths, concurrency, traffic mix, and where that puts the workload.

Pure functions over the canonical request table (:mod:`pipeline.schema`); no Dagster here.
The JSON keys are documented in ``docs/shape.md``. ``stage`` holds the contract the asset and
the command share.
"""

from __future__ import annotations

from pipeline.shape.arrivals import Quantisation, arrival_metrics, detect_quantisation
from pipeline.shape.common import PERCENTILE_METHOD, PERCENTILE_METHOD_DOC, ShapeError
from pipeline.shape.compute import compute_shape
from pipeline.shape.concurrency import ConcurrencyResult, peak_concurrency
from pipeline.shape.config import ShapeConfig
from pipeline.shape.findings import Finding, place_on_axes
from pipeline.shape.result import ShapeResult

__all__ = [
    "PERCENTILE_METHOD",
    "PERCENTILE_METHOD_DOC",
    "ConcurrencyResult",
    "Finding",
    "Quantisation",
    "ShapeConfig",
    "ShapeError",
    "ShapeResult",
    "arrival_metrics",
    "compute_shape",
    "detect_quantisation",
    "peak_concurrency",
    "place_on_axes",
]
