"""What a load test produces: each rate's per-request table, with the settings, deployment and
workload it ran, and the run record and sidecar manifest written from them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import polars as pl

from pipeline.bench.manifest import TRACE_DATASET, BenchManifest
from pipeline.loadtest.compute import LoadtestInputs, public_url
from pipeline.loadtest.config import LoadtestConfig
from pipeline.loadtest.plan import RatePlan

#: What served the requests: exactly what a sidecar manifest says (engine, GPUs, price…),
#: validated by its rules (docs/bench.md#the-sidecar-manifest).
Deployment = BenchManifest

#: The manifest keys a run's flags set (the rest come from the run itself).
DEPLOYMENT_KEYS = (
    "engine",
    "engine_version",
    "gpu_type",
    "gpu_count",
    "quantization",
    "price_per_gpu_hour_usd",
)


@dataclass
class RateRun:
    plan: RatePlan
    requests: pl.DataFrame
    started: dt.datetime
    interrupted: bool


@dataclass
class LoadtestResult:
    settings: LoadtestConfig
    deployment: Deployment
    workload: LoadtestInputs
    rates: list[RateRun]
    started: dt.datetime
    finished: dt.datetime
    interrupted: bool


def deployment_values(deployment: Deployment) -> dict[str, Any]:
    return {key: getattr(deployment, key) for key in DEPLOYMENT_KEYS}


def manifest(run: LoadtestResult) -> dict[str, Any]:
    values: dict[str, Any] = {
        **deployment_values(run.deployment),
        "run_date": run.started.date().isoformat(),
        "model": run.settings.model,
        "workload": run.workload.name or run.workload.label,
        "dataset": TRACE_DATASET,
        "label": f"loadtest-{run.deployment.engine}",
        "tool_version": _version(),
    }
    return {k: v for k, v in values.items() if v is not None}


def _version() -> str:
    try:
        return f"enginefit {metadata.version('enginefit')}"
    except metadata.PackageNotFoundError:
        return "enginefit"


def run_record(
    run: LoadtestResult, summaries: list[dict[str, Any]], files: list[str]
) -> dict[str, Any]:
    trace = run.workload.trace
    settings = run.settings.model_dump(mode="json")
    settings["endpoint"] = public_url(run.settings.endpoint or "")
    return {
        "tool": _version(),
        "started_at": run.started.isoformat(),
        "finished_at": run.finished.isoformat(),
        "interrupted": run.interrupted,
        "settings": settings,
        "deployment": {k: v for k, v in deployment_values(run.deployment).items() if v is not None},
        "workload": {
            "label": run.workload.label,
            "trace_requests_loaded": trace.requests,
            "block_size": trace.block_size,
            "hashes_known": trace.hashes_known,
            "output_tokens_filled_with_median": trace.output_filled,
        },
        "rates": summaries,
        "rate_files": files,
    }
