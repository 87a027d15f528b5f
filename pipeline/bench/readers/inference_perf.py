"""kubernetes-sigs inference-perf ``stage_<N>_lifecycle_metrics.json``: one stage file is one
load point (``record_index`` N), latencies in seconds; the run's ``config.yaml`` beside it gives
the load type and the model. The cross-stage ``summary_lifecycle_metrics.json`` is never read as
a load point. Fields, quirks and upstream sources: docs/bench.md#inference-perf.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.bench.detect import BenchFormatError, Document
from pipeline.bench.readers._common import BenchFormat, Companion, Ctx, RawPoint, first_object
from pipeline.settings import parse_yaml

TOOL = "inference_perf"
CONFIG_NAME = "config.yaml"
ACHIEVED_TOLERANCE = 0.05
_STAGE_NAME = re.compile(r"^stage_(\d+)_lifecycle_metrics\.json$")


def _config(point: RawPoint, path: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` beside ``path`` ({} when absent or not YAML: it only adds
    detail), recorded among the point's companion files when read."""
    cfg = path.parent / CONFIG_NAME
    if not cfg.is_file():
        return {}
    try:
        doc = parse_yaml(point.read_companion(cfg, "inference-perf run config"))
    except (BenchFormatError, yaml.YAMLError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _lat(ctx: Ctx, lat: Mapping[str, Any], name: str, prefix: str) -> dict[str, float | None]:
    block = ctx.dict_(lat, name)
    if not block:
        return {}
    stats = ctx.stats_block(block, f"successes.latency.{name}", 1000.0, prefix)
    return {f"{k}_ms": x for k, x in stats.items()}


def read(ctx: Ctx, obj: Mapping[str, Any], stage: int) -> RawPoint:
    point = RawPoint(record_index=stage)
    v = point.values
    v["source_schema"] = "inference-perf-stage"
    cfg = _config(point, ctx.path)
    server = cfg.get("server") if isinstance(cfg.get("server"), dict) else {}
    load_cfg = cfg.get("load") if isinstance(cfg.get("load"), dict) else {}
    data_cfg = cfg.get("data") if isinstance(cfg.get("data"), dict) else {}
    api_cfg = cfg.get("api") if isinstance(cfg.get("api"), dict) else {}
    if isinstance(server, dict):
        model = server.get("model_name")
        v["model"] = None if model is None else str(model)
        if server.get("type") is not None:
            point.file_metadata["config.server.type"] = str(server["type"])
        if server.get("ignore_eos") is not None:
            point.file_metadata["config.server.ignore_eos"] = bool(server["ignore_eos"])
    if isinstance(api_cfg, dict) and api_cfg.get("type") is not None:
        v["client_protocol"] = str(api_cfg["type"])
    if isinstance(data_cfg, dict) and data_cfg.get("type") is not None:
        dtype = str(data_cfg["type"])
        v["dataset"] = dtype
        sub = data_cfg.get(dtype)
        if isinstance(sub, dict) and isinstance(sub.get("output_len"), int):
            v["output_len_target"] = sub["output_len"]
    load = ctx.dict_(obj, "load_summary")
    successes = ctx.dict_(obj, "successes")
    failures = ctx.dict_(obj, "failures")
    requested = ctx.num(load, "requested_rate", label="load_summary.requested_rate")
    achieved = ctx.num(load, "achieved_rate", label="load_summary.achieved_rate")
    conc = ctx.int_(load, "concurrency", label="load_summary.concurrency")
    load_type = str(load_cfg.get("type", "")).lower() if isinstance(load_cfg, dict) else ""
    if load_type == "concurrent" or (requested is None and conc is not None):
        v["load_mode"], v["arrival_process"] = "closed", "concurrency"
    else:
        v["load_mode"] = "open"
        v["arrival_process"] = (
            load_type
            if load_type in ("constant", "poisson")
            else ("trace" if "trace" in load_type else "unknown")
        )
        v["offered_rate_rps"] = requested
    v["achieved_rate_rps"] = achieved
    v["concurrency"] = conc
    if (
        v["load_mode"] == "open"
        and requested
        and achieved is not None
        and achieved < (1.0 - ACHIEVED_TOLERANCE) * requested
    ):
        point.notes.append(
            f"achieved send rate {achieved:.2f} req/s is below the requested {requested:.2f} "
            "req/s: the client did not produce the offered load"
        )
    completed = ctx.int_(successes, "count", label="successes.count")
    failed = ctx.int_(failures, "count", label="failures.count")
    v["completed"], v["failed"] = completed, failed
    v["num_requests"] = ctx.int_(load, "count", label="load_summary.count")
    thr = ctx.dict_(successes, "throughput")
    rps = ctx.num(thr, "requests_per_sec", label="successes.throughput.requests_per_sec")
    v["request_throughput_rps"] = rps
    v["input_tokens_per_s"] = ctx.num(thr, "input_tokens_per_sec")
    v["output_tokens_per_s"] = ctx.num(thr, "output_tokens_per_sec")
    v["total_tokens_per_s"] = ctx.num(thr, "total_tokens_per_sec")
    bench_time = ctx.num(obj, "benchmark_time_seconds")
    if bench_time is not None:
        v["duration_s"], v["duration_kind"] = bench_time, "first_send_to_last_done"
    elif completed and rps:
        v["duration_s"], v["duration_kind"] = completed / rps, "derived"
    lat = ctx.dict_(successes, "latency")
    native: dict[str, float | None] = {}
    for name, prefix in (
        ("time_to_first_token", "ttft"),
        ("time_per_output_token", "tpot"),
        ("inter_token_latency", "itl"),
        ("request_latency", "e2e"),
        ("normalized_time_per_output_token", "normalized_time_per_output_token"),
    ):
        native.update(_lat(ctx, lat, name, prefix))
    point.native = native
    for new, old, side in (
        ("prompt_tokens", "prompt_len", "input"),
        ("output_tokens", "output_len", "output"),
    ):
        key = new if new in successes else old
        block = ctx.dict_(successes, key)
        if not block:
            continue
        stats = ctx.stats_block(block, f"successes.{key}", 1.0, f"{side}_tokens")
        for stat in ("mean", "p50", "p99"):
            v[f"{side}_tokens_{stat}"] = stats.get(f"{side}_tokens_{stat}")
        total = ctx.num(block, "total", label=f"successes.{key}.total")
        mean = stats.get(f"{side}_tokens_mean")
        if total is None and mean is not None and completed is not None:
            total = mean * completed
        v[f"total_{side}_tokens"] = ctx.rounded(total, f"successes.{key}.total")
        lo = ctx.num(block, "min", label=f"successes.{key}.min")
        hi = ctx.num(block, "max", label=f"successes.{key}.max")
        if lo is not None and hi is not None:
            v[f"{side}_len_fixed"] = lo == hi
    v["output_tokens_source"] = "unknown"
    goodput = ctx.dict_(successes, "goodput_metrics")
    if goodput:
        v["goodput_rps"] = ctx.num(
            goodput, "request_goodput", label="goodput_metrics.request_goodput"
        )
    return point


def stage_number(path: Path) -> int | None:
    m = _STAGE_NAME.match(path.name)
    return int(m.group(1)) if m else None


def read_stage_file(doc: Document) -> list[RawPoint]:
    stage = stage_number(doc.path)
    return [read(Ctx(doc.path, f"stage {stage}"), doc.records[0], 0 if stage is None else stage)]


def detect(path: Path, record: Any) -> str | None:
    first = first_object(record)
    if first is not None and {"start_time", "end_time", "info"} <= first.keys():
        return "inference_perf_requests"
    if not isinstance(record, dict):
        return None
    if "load_summary" in record and "successes" in record:
        if path.name.startswith("summary_"):
            return "inference_perf_summary"
        load = record["load_summary"] if isinstance(record["load_summary"], dict) else {}
        staged = stage_number(path) is not None or "requested_rate" in load or "concurrency" in load
        return TOOL if staged else "inference_perf_summary"
    if isinstance(record.get("load"), dict) and "server" in record:
        return "inference_perf_config"
    return None


FORMAT = BenchFormat(
    tool=TOOL,
    title="inference-perf",
    files="stage_<N>_lifecycle_metrics.json",
    needs="`load_summary` and `successes`, the file named `stage_<N>_lifecycle_metrics.json` or "
    "`load_summary` has `requested_rate` or `concurrency`",
    detect=detect,
    read=read_stage_file,
    companions=(
        Companion(
            "inference_perf_summary",
            "`load_summary` and `successes`, the file named `summary_…` or neither a stage file "
            "nor a rate",
            "inference-perf cross-stage summary (aggregates every stage) — skipped: never use it "
            "for an SLO search; read the stage_N files (inference-perf issue #70)",
        ),
        Companion(
            "inference_perf_config",
            "an object with a `load` object and `server` (the run's `config.yaml`)",
            "inference-perf run config (read beside the stage files); not a load point by itself",
        ),
        Companion(
            "inference_perf_requests",
            "a list of objects, the first with `start_time`, `end_time` and `info`",
            "inference-perf per-request file (mixes all stages; not used); "
            "not a load point by itself",
        ),
    ),
    side_files=("*_prometheus_metrics.json",),
)
