"""Write the shape stage's files (the shell around the pure computations).

``<out_dir>/`` receives::

    workload_shape.json   every metric and finding (keys in docs/shape.md)
    workload_facts.json   pipeline.facts.WorkloadFacts.as_dict() (NaN written as null)
    concurrency.parquet   downsampled concurrency envelope (bucket_start, bucket_s,
                          concurrency_max, concurrency_min, estimated)
    lengths_cdf.svg, arrivals.svg, concurrency.svg
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.facts import WorkloadFacts
from pipeline.shape.charts import shape_charts
from pipeline.shape.common import json_safe
from pipeline.shape.config import ShapeConfig
from pipeline.shape.report import ShapeResult, compute_shape, facts_from_shape
from pipeline.store import write_bytes_atomic, write_json_atomic, write_parquet_atomic

SHAPE_JSON = "workload_shape.json"
FACTS_JSON = "workload_facts.json"
CONCURRENCY_PARQUET = "concurrency.parquet"


@dataclass(frozen=True)
class ShapeOutputs:
    result: ShapeResult
    facts: WorkloadFacts
    paths: dict[str, Path]


def write_shape_outputs(
    requests: pl.LazyFrame | pl.DataFrame, cfg: ShapeConfig, out_dir: Path
) -> ShapeOutputs:
    """Compute the shape of ``requests`` and write every output file atomically into ``out_dir``."""
    result = compute_shape(requests, cfg)
    facts = facts_from_shape(result)
    shape_json = result.to_json()
    paths = {
        "shape_json": out_dir / SHAPE_JSON,
        "facts_json": out_dir / FACTS_JSON,
        "concurrency_parquet": out_dir / CONCURRENCY_PARQUET,
    }
    write_json_atomic(paths["shape_json"], shape_json)
    write_json_atomic(paths["facts_json"], json_safe(facts.as_dict()))
    write_parquet_atomic(result.concurrency.series, paths["concurrency_parquet"])
    for name, svg in shape_charts(
        requests, shape_json, result.concurrency.series, cfg.plot_points
    ).items():
        paths[name.removesuffix(".svg") + "_svg"] = out_dir / name
        write_bytes_atomic(out_dir / name, svg)
    return ShapeOutputs(result=result, facts=facts, paths=paths)
