"""NVIDIA genai-perf ``profile_export_genai_perf.json``: ``{unit, avg, p…}`` blocks converted by
their unit; its ``inter_token_latency`` is per request, so it fills **tpot**. With perf_analyzer's
raw ``profile_export.json`` beside it, ttft, e2e and per-gap ITL are recomputed from its
timestamps. Fields, quirks and upstream sources: docs/bench.md#genai-perf.
"""

from __future__ import annotations

import itertools
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
    per_request_frame,
    whole_document,
)
from pipeline.errors import InputFormatError
from pipeline.safe_read import parse_json

TOOL = "genai_perf"
RAW_NAME = "profile_export.json"
UNIT_TO_MS: dict[str, float] = {
    "ms": 1.0,
    "s": 1000.0,
    "sec": 1000.0,
    "seconds": 1000.0,
    "us": 1e-3,
    "µs": 1e-3,
    "ns": 1e-6,
}


def block_stats(
    ctx: Ctx, obj: Mapping[str, Any], name: str, prefix: str, *, time: bool = True
) -> dict[str, float | None]:
    """Stats of one ``{unit, avg, pNN…}`` block; time blocks are converted to ms."""
    block = obj.get(name)
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ctx.fail(name, f"expected a metric block object, got {type(block).__name__}")
    scale = 1.0
    if time:
        unit = str(block.get("unit", "ms")).strip().lower()
        if unit not in UNIT_TO_MS:
            raise ctx.fail(f"{name}.unit", f"unknown time unit {block.get('unit')!r}")
        scale = UNIT_TO_MS[unit]
    return ctx.stats_block(block, name, scale, prefix)


def block_value(ctx: Ctx, obj: Mapping[str, Any], name: str, stat: str = "avg") -> float | None:
    block = obj.get(name)
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ctx.fail(name, f"expected a metric block object, got {type(block).__name__}")
    return ctx.num(block, stat, label=f"{name}.{stat}")


def add_latency_blocks(ctx: Ctx, obj: Mapping[str, Any], point: RawPoint) -> None:
    for name, family in (
        ("time_to_first_token", "ttft"),
        ("inter_token_latency", "tpot"),
        ("request_latency", "e2e"),
        ("inter_chunk_latency", "itl"),
        ("time_to_second_token", "time_to_second_token"),
    ):
        stats = block_stats(ctx, obj, name, family)
        point.native.update({f"{k}_ms": x for k, x in stats.items()})


def add_length_blocks(ctx: Ctx, obj: Mapping[str, Any], point: RawPoint) -> None:
    for name, prefix in (("input_sequence_length", "input"), ("output_sequence_length", "output")):
        stats = block_stats(ctx, obj, name, f"{prefix}_tokens", time=False)
        for stat in ("mean", "p50", "p99"):
            point.values[f"{prefix}_tokens_{stat}"] = stats.get(f"{prefix}_tokens_{stat}")
        lo = block_value(ctx, obj, name, "min")
        hi = block_value(ctx, obj, name, "max")
        if lo is not None and hi is not None:
            point.values[f"{prefix}_len_fixed"] = lo == hi


def _stimulus(ctx: Ctx, ic: Mapping[str, Any]) -> tuple[int | None, float | None]:
    pa = ic.get("perf_analyzer")
    if isinstance(pa, dict):
        stim = ctx.dict_(pa, "stimulus")
        return ctx.int_(stim, "concurrency"), ctx.num(stim, "request_rate")
    return ctx.int_(ic, "concurrency"), ctx.num(ic, "request_rate")


def read(ctx: Ctx, obj: Mapping[str, Any]) -> RawPoint:
    point = RawPoint(record_index=0)
    v = point.values
    v["source_schema"] = "genai-perf"
    ic = ctx.dict_(obj, "input_config")
    models = ic.get("model_names", ic.get("model"))
    v["model"] = first_str(models)
    endpoint = ic.get("endpoint") if isinstance(ic.get("endpoint"), dict) else {}
    etype = endpoint.get("type") if isinstance(endpoint, dict) else None
    v["client_protocol"] = None if etype is None else f"openai-{etype}"
    if etype is None and ic.get("endpoint_type") is not None:
        v["client_protocol"] = f"openai-{ic['endpoint_type']}"
    conc, rate = _stimulus(ctx, ic)
    if rate is not None:
        v["load_mode"], v["arrival_process"], v["offered_rate_rps"] = "open", "unknown", rate
        v["concurrency"] = conc
    else:
        v["load_mode"], v["arrival_process"], v["concurrency"] = "closed", "concurrency", conc
    count = block_value(ctx, obj, "request_count")
    completed = ctx.to_int(count, "request_count.avg")
    v["completed"] = completed
    thr = block_value(ctx, obj, "request_throughput")
    v["request_throughput_rps"] = thr
    v["output_tokens_per_s"] = block_value(ctx, obj, "output_token_throughput")
    if completed is not None and thr:
        v["duration_s"] = completed / thr
        v["duration_kind"] = "derived"
    v["goodput_rps"] = block_value(ctx, obj, "request_goodput")
    add_latency_blocks(ctx, obj, point)
    add_length_blocks(ctx, obj, point)
    if completed is not None:
        for side in ("input", "output"):
            mean = v.get(f"{side}_tokens_mean")
            if mean is not None and math.isfinite(mean):  # else unknown (the mean is screened)
                total = ctx.rounded(mean * completed, f"{side}_sequence_length.avg × count")
                v[f"total_{side}_tokens"] = total
    v["output_tokens_source"] = "client_retokenized"
    inp = ctx.dict_(ic, "input")
    synth = ctx.dict_(inp, "synthetic_tokens")
    outp = ctx.dict_(inp, "output_tokens")
    v["input_len_target"] = ctx.int_(synth, "mean", label="input_config.input.synthetic_tokens")
    v["output_len_target"] = ctx.int_(outp, "mean", label="input_config.input.output_tokens")
    point.notes.append("genai-perf writes no failure count: failed is null")
    backend = endpoint.get("backend") if isinstance(endpoint, dict) else None
    if backend is not None:
        point.file_metadata["input_config.endpoint.backend"] = str(backend)
    telemetry = obj.get("telemetry_stats")
    if isinstance(telemetry, dict):
        point.file_metadata["telemetry_stats"] = sorted(str(k) for k in telemetry)
    raw = raw_path(ctx.path)
    if raw.is_file() and raw != ctx.path:
        frame = raw_per_request(raw, point.read_companion(raw, "perf_analyzer export"), conc, rate)
        if frame is not None:
            point.per_request = frame
            point.notes.append(f"ttft/e2e/itl recomputed from {raw.name}")
    return point


def raw_path(summary: Path) -> Path:
    """``<dir>/<stem>_genai_perf.json`` → ``<dir>/<stem>.json`` (default ``profile_export.json``)."""
    return companion_path(summary, "_genai_perf.json", ".json", RAW_NAME)


def raw_per_request(
    raw: Path, text: str, conc: int | None, rate: float | None
) -> pl.DataFrame | None:
    """Per-request ttft/e2e/per-gap ITL from a perf_analyzer ``profile_export.json`` (``text``,
    read from ``raw``)."""

    try:
        doc = parse_json(text, raw, strict=False)
    except InputFormatError as exc:
        raise BenchFormatError(f"cannot read perf_analyzer export: {exc}") from exc
    ctx = Ctx(raw, "experiments")
    experiments = doc.get("experiments") if isinstance(doc, dict) else None
    if not isinstance(experiments, list) or not experiments:
        raise ctx.fail("experiments", "expected a non-empty list")
    chosen = None
    for i, exp in enumerate(experiments):
        if not isinstance(exp, dict):
            raise ctx.fail(f"experiments[{i}]", "expected an object")
        e_raw = exp.get("experiment")
        e: dict[str, Any] = e_raw if isinstance(e_raw, dict) else {}
        mode, value = e.get("mode"), e.get("value")
        if (mode == "concurrency" and conc is not None and value == conc) or (
            mode == "request_rate" and rate is not None and value == rate
        ):
            chosen = (i, exp)
            break
    if chosen is None:
        if len(experiments) != 1:
            return None
        chosen = (0, experiments[0])
    i, exp = chosen
    ctx = Ctx(raw, f"experiments[{i}]")
    requests = exp.get("requests")
    if not isinstance(requests, list):
        raise ctx.fail("requests", "expected a list")
    ttft: list[float | None] = []
    e2e: list[float | None] = []
    itl: list[list[float]] = []
    ok: list[bool] = []
    for j, req in enumerate(requests):
        if not isinstance(req, dict):
            raise ctx.fail(f"requests[{j}]", "expected an object")
        t0 = ctx.num(req, "timestamp", label=f"requests[{j}].timestamp")
        stamps = ctx.num_list(req, "response_timestamps") or []
        ts = [s for s in stamps if s is not None]
        if t0 is None or not ts:
            ok.append(False)
            ttft.append(None)
            e2e.append(None)
            itl.append([])
            continue
        ok.append(True)
        ttft.append((ts[0] - t0) / 1e6)
        e2e.append((ts[-1] - t0) / 1e6)
        itl.append([(b - a) / 1e6 for a, b in itertools.pairwise(ts)])
    return per_request_frame(
        {"ok": ok, "ttft_ms": ttft, "e2e_ms": e2e, "itl_ms": itl}, len(requests)
    )


def has_unit_blocks(obj: Mapping[str, Any]) -> bool:
    """``time_to_first_token`` is a ``{unit, avg, p…}`` block: genai-perf's layout, and aiperf's."""
    ttft = obj.get("time_to_first_token")
    return isinstance(ttft, dict) and "unit" in ttft


def detect(path: Path, record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("experiments"), list):
        return "genai_perf_raw"
    return TOOL if has_unit_blocks(record) else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="genai-perf",
    files="profile_export_genai_perf.json",
    needs="`time_to_first_token` is an object with `unit`",
    detect=detect,
    read=whole_document(read),
    companions=(
        Companion(
            "genai_perf_raw",
            "`experiments` is a list (perf_analyzer's `profile_export.json`)",
            "genai-perf raw perf_analyzer export (read beside its profile_export_genai_perf.json "
            "for per-request recomputation); not a load point by itself",
        ),
    ),
    side_files=("inputs.json", "llm_inputs.json"),
)
