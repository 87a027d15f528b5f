"""Workload shape: arrivals, lengths, concurrency, traffic mix, and where that puts the workload.

Pure functions over the canonical request table (:mod:`pipeline.schema`); no Dagster here.
The JSON keys are documented in ``docs/shape.md``.
"""

from __future__ import annotations

from pipeline.shape.arrivals import Quantisation, arrival_metrics, detect_quantisation
from pipeline.shape.common import PERCENTILE_METHOD, PERCENTILE_METHOD_DOC, ShapeError
from pipeline.shape.concurrency import ConcurrencyResult, concurrency_steps, peak_concurrency
from pipeline.shape.config import ShapeConfig, parse_shape_config
from pipeline.shape.findings import Finding, place_on_axes
from pipeline.shape.report import (
    ShapeResult,
    compute_shape,
    compute_workload_facts,
    facts_from_shape,
    render_text,
    summary_tables,
)

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
    "compute_workload_facts",
    "concurrency_steps",
    "detect_quantisation",
    "facts_from_shape",
    "parse_shape_config",
    "peak_concurrency",
    "place_on_axes",
    "render_text",
    "summary_tables",
]
