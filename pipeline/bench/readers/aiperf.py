"""ai-dynamo aiperf ``profile_export_aiperf.json``, in genai-perf's block layout: its
``inter_token_latency`` (per request) fills **tpot**, ``inter_chunk_latency`` (per gap) **itl**.
With ``profile_export.jsonl`` beside it every family is recomputed from its ``profiling``-phase
lines. Fields, load settings by version, quirks and upstream sources: docs/bench.md#aiperf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.bench.detect import BenchFormatError
from pipeline.bench.readers._common import (
    BenchFormat,
    Companion,
    Ctx,
    RawPoint,
    companion_path,
    first_str,
    parse_iso,
    per_request_frame,
    truncate_error,
    whole_document,
    with_tpot,
)
from pipeline.bench.readers.genai_perf import (
    UNIT_TO_MS,
    add_latency_blocks,
    add_length_blocks,
    block_value,
    has_unit_blocks,
)
from pipeline.errors import InputFormatError
from pipeline.safe_read import parse_json

TOOL = "aiperf"
JSONL_NAME = "profile_export.jsonl"


def _load(ctx: Ctx, ic: Mapping[str, Any], point: RawPoint) -> None:
    v = point.values
    loadgen = ctx.dict_(ic, "loadgen")
    phases = ic.get("phases")
    conc: int | None = None
    rate: float | None = None
    mode_name: str | None = None
    if loadgen:
        conc = ctx.int_(loadgen, "concurrency")
        rate = ctx.num(loadgen, "request_rate")
        # v0.1.0 spells the schedule request_rate_mode, later 0.x releases arrival_pattern
        mode_name = ctx.str_(loadgen, "request_rate_mode") or ctx.str_(loadgen, "arrival_pattern")
    elif isinstance(phases, list):
        for phase in phases:
            if not isinstance(phase, dict) or phase.get("exclude_from_results"):
                continue
            conc = ctx.int_(phase, "concurrency")
            rate = ctx.num(phase, "rate")
            mode_name = ctx.str_(phase, "type")
            break
    mode_l = (mode_name or "").lower()
    if "burst" in mode_l and rate is None and conc is not None:
        # concurrency_burst with --concurrency N: N users, each sending its next request when
        # the last one finishes (aiperf's default with --concurrency alone): closed loop at N
        v["load_mode"], v["arrival_process"] = "closed", "concurrency"
    elif "burst" in mode_l and rate is None:
        v["load_mode"], v["arrival_process"], v["offered_rate_rps"] = "offline", "burst", math.inf
    elif rate is not None:
        arrival = mode_l if mode_l in ("poisson", "constant", "gamma") else "unknown"
        v["load_mode"], v["arrival_process"], v["offered_rate_rps"] = "open", arrival, rate
    elif conc is not None:
        v["load_mode"], v["arrival_process"] = "closed", "concurrency"
    else:
        v["load_mode"], v["arrival_process"] = None, "unknown"
        point.notes.append("aiperf load settings not found in input_config")
    v["concurrency"] = conc


def read(ctx: Ctx, obj: Mapping[str, Any]) -> RawPoint:
    point = RawPoint(record_index=0)
    v = point.values
    version = obj.get("aiperf_version")
    v["tool_version"] = None if version is None else str(version)
    v["source_schema"] = "aiperf-0.10" if "schema_version" in obj else "aiperf-0.1"
    ic = ctx.dict_(obj, "input_config")
    endpoint = ctx.dict_(ic, "endpoint")
    model = first_str(endpoint.get("model_names"))
    models = ic.get("models")
    if model is None and isinstance(models, dict) and isinstance(models.get("items"), list):
        items = models["items"]
        if items and isinstance(items[0], dict):
            model = first_str(items[0].get("name"))
    v["model"] = model
    etype = endpoint.get("type")
    v["client_protocol"] = None if etype is None else f"openai-{etype}"
    _load(ctx, ic, point)
    completed = ctx.to_int(block_value(ctx, obj, "request_count"), "request_count.avg")
    failed = ctx.to_int(block_value(ctx, obj, "error_request_count"), "error_request_count.avg")
    if failed is None and isinstance(obj.get("error_summary"), list) and not obj["error_summary"]:
        failed = 0
    v["completed"], v["failed"] = completed, failed
    if completed is not None and failed is not None:
        v["num_requests"] = completed + failed
    dur_block = obj.get("benchmark_duration")
    if isinstance(dur_block, dict):
        unit = str(dur_block.get("unit", "sec")).lower()
        if unit not in UNIT_TO_MS:
            raise ctx.fail("benchmark_duration.unit", f"unknown time unit {unit!r}")
        d = ctx.num(dur_block, "avg", label="benchmark_duration.avg")
        v["duration_s"] = None if d is None else d * UNIT_TO_MS[unit] / 1000.0
        v["duration_kind"] = "first_req_to_last_resp"
    v["request_throughput_rps"] = block_value(ctx, obj, "request_throughput")
    v["output_tokens_per_s"] = block_value(ctx, obj, "output_token_throughput")
    v["total_tokens_per_s"] = block_value(ctx, obj, "total_token_throughput")
    v["goodput_rps"] = block_value(ctx, obj, "goodput")
    for name, col in (("total_isl", "total_input_tokens"), ("total_osl", "total_output_tokens")):
        val = block_value(ctx, obj, name)
        v[col] = ctx.rounded(val, f"{name}.avg")
    v["output_tokens_source"] = "unknown"
    add_latency_blocks(ctx, obj, point)
    add_length_blocks(ctx, obj, point)
    v["started_at"] = parse_iso(ctx, obj.get("start_time"), "start_time")
    if v["started_at"] is not None:
        v["run_date"] = v["started_at"].date()
    _telemetry_hint(obj, point)
    jsonl = jsonl_path(ctx.path)
    if jsonl.is_file():
        point.per_request = read_jsonl(
            jsonl, point.read_companion(jsonl, "aiperf per-request export")
        )
        point.notes.append(f"latencies recomputed from {jsonl.name}")
    return point


def jsonl_path(summary: Path) -> Path:
    """``<dir>/<stem>_aiperf.json`` → ``<dir>/<stem>.jsonl`` (default ``profile_export.jsonl``)."""
    return companion_path(summary, "_aiperf.json", ".jsonl", JSONL_NAME)


def _telemetry_hint(obj: Mapping[str, Any], point: RawPoint) -> None:
    names: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, val in x.items():
                if k == "gpu_name" and isinstance(val, str):
                    names.add(val)
                else:
                    walk(val)
        elif isinstance(x, list):
            for item in x:
                walk(item)

    walk(obj.get("telemetry_data"))
    if names:
        point.file_metadata["telemetry_gpu_names"] = sorted(names)


def _metric(ctx: Ctx, metrics: Mapping[str, Any], tag: str, *, time: bool = True) -> Any:
    block = metrics.get(tag)
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ctx.fail(f"metrics.{tag}", "expected {value, unit}")
    value = block.get("value")
    scale = 1.0
    if time:
        unit = str(block.get("unit", "ms")).lower()
        if unit not in UNIT_TO_MS:
            raise ctx.fail(f"metrics.{tag}.unit", f"unknown time unit {unit!r}")
        scale = UNIT_TO_MS[unit]
    if isinstance(value, list):
        out = []
        for i, x in enumerate(value):
            n = ctx.as_num(x, f"metrics.{tag}.value[{i}]")
            if n is None:
                raise ctx.fail(f"metrics.{tag}.value[{i}]", "expected a number, got null")
            out.append(n * scale)
        return out
    n = ctx.as_num(value, f"metrics.{tag}.value")
    return None if n is None else n * scale


def read_jsonl(path: Path, text: str) -> pl.DataFrame:
    """Per-request rows of an aiperf ``profile_export.jsonl`` (``text``, read from ``path``;
    profiling phase only)."""
    lines = text.splitlines()
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "ok",
            "error",
            "start_s",
            "ttft_ms",
            "e2e_ms",
            "itl_ms",
            "input_tokens",
            "output_tokens",
        )
    }
    starts_ns: list[float | None] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ctx = Ctx(path, f"line {line_no}")
        try:
            rec = parse_json(line, f"{path}: line {line_no}", strict=False)
        except InputFormatError as exc:
            raise BenchFormatError(str(exc)) from exc
        if not isinstance(rec, dict):
            raise ctx.fail("<line>", "expected an object")
        meta = ctx.dict_(rec, "metadata")
        phase = meta.get("benchmark_phase")
        if phase is not None and str(phase).lower() not in ("profiling", "profile"):
            continue
        metrics = ctx.dict_(rec, "metrics")
        err = rec.get("error")
        ok = err is None and not meta.get("was_cancelled", False)
        cols["ok"].append(ok)
        cols["error"].append(truncate_error(err.get("message") if isinstance(err, dict) else err))
        starts_ns.append(ctx.num(meta, "request_start_ns", label="metadata.request_start_ns"))
        cols["ttft_ms"].append(_metric(ctx, metrics, "time_to_first_token"))
        cols["e2e_ms"].append(_metric(ctx, metrics, "request_latency"))
        cols["itl_ms"].append(_metric(ctx, metrics, "inter_chunk_latency") or [])
        isl = _metric(ctx, metrics, "input_sequence_length", time=False)
        osl = _metric(ctx, metrics, "output_sequence_length", time=False)
        cols["input_tokens"].append(ctx.rounded(isl, "metrics.input_sequence_length"))
        cols["output_tokens"].append(ctx.rounded(osl, "metrics.output_sequence_length"))
    first = min((s for s in starts_ns if s is not None), default=None)
    cols["start_s"] = [
        (s - first) / 1e9 if s is not None and first is not None else None for s in starts_ns
    ]
    return with_tpot(per_request_frame(cols, len(cols["ok"])))


# keys aiperf's summary has and genai-perf's does not (besides ``input_config.loadgen``/``models``)
_MARKERS = (
    "aiperf_version",
    "schema_version",
    "benchmark_duration",
    "was_cancelled",
    "error_summary",
    "telemetry_data",
    "inter_chunk_latency",
    "error_request_count",
)


def detect(path: Path, record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    if has_unit_blocks(record):
        ic = record.get("input_config")
        loadgen = isinstance(ic, dict) and ("loadgen" in ic or "models" in ic)
        return TOOL if loadgen or any(k in record for k in _MARKERS) else None
    meta = record.get("metadata")
    return "aiperf_requests" if isinstance(meta, dict) and "request_start_ns" in meta else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="aiperf",
    files="profile_export_aiperf.json",
    needs="`time_to_first_token` is an object with `unit`, and one of `"
    + "`, `".join(_MARKERS)
    + "`, or `input_config` has `loadgen` or `models`",
    detect=detect,
    read=whole_document(read),
    companions=(
        Companion(
            "aiperf_requests",
            "`metadata.request_start_ns` (a line of aiperf's `profile_export.jsonl`)",
            "aiperf per-request export (read beside its profile_export_aiperf.json); "
            "not a load point by itself",
        ),
    ),
    refines=("genai_perf",),
    side_files=("inputs.json",),
)
