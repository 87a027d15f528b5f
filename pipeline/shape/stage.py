"""The shape stage: read_inputs → run → write, shared by the ``workload_shape`` asset and
``enginefit shape``; ``read_result`` is how later stages read it back.

Outputs (paths: :class:`pipeline.layout.ShapePaths`): the metrics document, the workload facts,
the downsampled concurrency envelope and three figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline import results
from pipeline.layout import WorkloadLayout
from pipeline.safe_read import read_json
from pipeline.shape.common import json_safe
from pipeline.shape.compute import compute_shape
from pipeline.shape.config import ShapeConfig
from pipeline.shape.present import figures
from pipeline.shape.result import ShapeResult
from pipeline.store import (
    open_stage_output,
    read_requests,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

STEP = results.Step(results.SHAPE, upstream=(results.REQUESTS,), sections=("shape",))


@dataclass(frozen=True)
class ShapeInputs:
    requests: pl.LazyFrame


def read_inputs(layout: WorkloadLayout) -> ShapeInputs:
    return ShapeInputs(read_requests(layout))


def run(inputs: ShapeInputs, settings: ShapeConfig) -> ShapeResult:
    return compute_shape(inputs.requests, settings)


def write(result: ShapeResult, layout: WorkloadLayout) -> dict[str, Path]:
    """Every output file, each written atomically; returns them by layout name."""
    open_stage_output(layout)
    paths = layout.shape
    written = {"summary": paths.summary, "facts": paths.facts, "concurrency": paths.concurrency}
    write_json_atomic(paths.summary, result.to_json())
    write_json_atomic(paths.facts, json_safe(result.facts.as_dict()))
    write_parquet_atomic(result.concurrency_series, paths.concurrency)
    if result.plots is not None:
        for name, svg in figures(result, result.plots).items():
            target = getattr(paths, name)
            write_bytes_atomic(target, svg)
            written[name] = target
    results.SHAPE.seal(layout, written.values())
    return written


def read_result(layout: WorkloadLayout) -> ShapeResult:
    """The shape result written for this workload (without the figures' data)."""
    paths = layout.shape
    metrics = read_json(results.SHAPE.require(layout))
    series = pl.read_parquet(paths.concurrency) if paths.concurrency.is_file() else None
    return ShapeResult.from_json(metrics, series)
