"""Benchmark results: reading them, SLO capacity, cost, fleet and validity.

:func:`read_bench_files` turns result files of vLLM ``bench serve``, SGLang ``bench_serving``,
guidellm, genai-perf, aiperf, llmperf and inference-perf into one normalised load-point table
(:data:`LOAD_POINT_SCHEMA`, documented in :mod:`pipeline.bench.schema`);
:func:`pipeline.bench.compute.analyse_bench` judges and costs them; ``stage`` is the contract the
assets and the command share.
"""

from __future__ import annotations

from pipeline.bench.detect import BenchFormatError
from pipeline.bench.manifest import BenchManifest, BenchManifestError, load_manifest
from pipeline.bench.readers import read_bench_files
from pipeline.bench.schema import (
    LOAD_POINT_SCHEMA,
    PER_REQUEST_SCHEMA,
    BenchReadResult,
)

__all__ = [
    "LOAD_POINT_SCHEMA",
    "PER_REQUEST_SCHEMA",
    "BenchFormatError",
    "BenchManifest",
    "BenchManifestError",
    "BenchReadResult",
    "load_manifest",
    "read_bench_files",
]
