"""guidellm ``benchmarks.json`` / ``benchmarks.yaml``: one point per benchmark, in schema
generations G1–G4 told apart by keys (:func:`generation`). Its ``inter_token_latency_ms`` fills
tpot, weighted by tokens; per-gap ITL is not recoverable; only G1 (raw results only) is
recomputed from per-request data. Fields, quirks and upstream sources: docs/bench.md#guidellm.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.bench.detect import BenchFormatError, Document
from pipeline.bench.readers._common import (
    BenchFormat,
    Ctx,
    RawPoint,
    epoch_to_utc,
    is_short_hint,
    per_request_frame,
    with_tpot,
)

TOOL = "guidellm"


def generation(doc: Mapping[str, Any], first: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if "config" in first and "scheduler_metrics" in first:
        version = meta.get("version") if isinstance(meta, dict) else None
        if version == 2 or ("config" in doc and "args" not in doc):
            return "guidellm-G4"
        if version == 1:
            return "guidellm-G3'"
        return "guidellm-G3"
    if "args" in first and ("run_stats" in first or "worker" in first):
        return "guidellm-G2"
    if "benchmarks" in first:
        return "guidellm-G1"
    return "unknown"


def _status_block(ctx: Ctx, metrics: Mapping[str, Any], name: str) -> dict[str, Any]:
    block = ctx.dict_(metrics, name)
    return ctx.dict_(block, "successful") if block else {}


def _dist(
    ctx: Ctx, metrics: Mapping[str, Any], name: str, scale: float, prefix: str
) -> dict[str, float | None]:
    succ = _status_block(ctx, metrics, name)
    if not succ:
        return {}
    flat = dict(succ)
    pcts = ctx.dict_(succ, "percentiles")
    for key in ("p50", "p90", "p95", "p99"):
        if key in pcts:
            flat[key] = pcts[key]
    if "p50" not in flat and "median" in succ:
        flat["p50"] = succ["median"]
    flat.pop("median", None)
    return ctx.stats_block(flat, f"metrics.{name}.successful", scale, prefix)


def read(document: Document) -> list[RawPoint]:
    points = _read(Ctx(document.path, "document"), document.records[0])
    for point in points:
        # guidellm weights its inter-token statistics by tokens, not requests
        point.values["tpot_definition"] = "decode_token_weighted"
    return points


def _read(path_ctx: Ctx, doc: Mapping[str, Any]) -> list[RawPoint]:
    benchmarks = doc.get("benchmarks")
    if not isinstance(benchmarks, list):
        raise path_ctx.fail("benchmarks", "expected a list")
    if not benchmarks:
        raise BenchFormatError(f"{path_ctx.path}: guidellm file has an empty 'benchmarks' list")
    first = benchmarks[0]
    if not isinstance(first, dict):
        raise path_ctx.fail("benchmarks[0]", f"expected an object, got {type(first).__name__}")
    gen = generation(doc, first)
    if gen == "guidellm-G1":
        return _read_g1(path_ctx, benchmarks)
    if gen == "unknown":
        raise BenchFormatError(
            f"{path_ctx.path}: 'benchmarks' elements match no guidellm schema generation "
            f"(keys {sorted(first)[:12]})"
        )
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    tool_version = meta.get("guidellm_version") if isinstance(meta, dict) else None
    top_args = doc.get("args") if isinstance(doc.get("args"), dict) else {}
    top_config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    labels: dict[str, Any] = {}
    if isinstance(top_config, dict):
        cm = top_config.get("metadata")
        if isinstance(cm, dict) and isinstance(cm.get("labels"), dict):
            labels = {str(k): v for k, v in cm["labels"].items() if is_short_hint(v)}
    points: list[RawPoint] = []
    for i, bench in enumerate(benchmarks):
        ctx = Ctx(path_ctx.path, f"benchmarks[{i}]")
        if not isinstance(bench, dict):
            raise ctx.fail("benchmarks", f"element is {type(bench).__name__}, not an object")
        points.append(_benchmark(ctx, bench, i, gen, top_args or {}, top_config or {}))
        p = points[-1]
        if tool_version is not None:
            p.values["tool_version"] = str(tool_version)
        if labels:
            p.file_metadata["labels"] = labels
            p.file_label = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
    return points


def _benchmark(
    ctx: Ctx,
    bench: Mapping[str, Any],
    index: int,
    gen: str,
    top_args: Mapping[str, Any],
    top_config: Mapping[str, Any],
) -> RawPoint:
    point = RawPoint(record_index=index)
    v = point.values
    v["source_schema"] = gen
    metrics = ctx.dict_(bench, "metrics")
    if gen == "guidellm-G2":
        args = ctx.dict_(bench, "args")
        strategy = ctx.dict_(args, "strategy")
        worker = ctx.dict_(bench, "worker")
        v["model"] = ctx.str_(worker, "backend_model")
        v["client_protocol"] = ctx.str_(worker, "backend_type")
        totals = ctx.dict_(bench, "request_totals")
        profile_conc = ctx.dict_(args, "profile").get("max_concurrency")
        loader = ctx.dict_(bench, "request_loader")
        data = loader.get("data")
        if is_short_hint(data):  # a dataset id, path or synthetic config, not inline prompts
            point.file_metadata["data"] = data
    else:
        config = ctx.dict_(bench, "config")
        strategy = ctx.dict_(config, "strategy")
        backend = ctx.dict_(config, "backend")
        model = backend.get("model") or top_args.get("model")
        if model is None:
            spec = top_config.get("spec") if isinstance(top_config.get("spec"), dict) else {}
            sb = spec.get("backend") if isinstance(spec, dict) else None
            model = sb.get("model") if isinstance(sb, dict) else None
        v["model"] = None if model is None else str(model)
        kind = backend.get("kind") or top_args.get("backend")
        v["client_protocol"] = None if kind is None else str(kind)
        totals = ctx.dict_(metrics, "request_totals")
        profile_conc = ctx.dict_(config, "profile").get("max_concurrency")
        n_listed = _listed(bench)
        succ_total = totals.get("successful")
        if n_listed and isinstance(succ_total, int) and n_listed != succ_total:
            point.notes.append(
                f"{n_listed} successful requests listed but {succ_total} inside the measurement "
                "window; statistics are guidellm's (window only)"
            )
    stype = ctx.str_(strategy, "type_") or ctx.str_(strategy, "kind")
    conc: int | None
    rate = ctx.num(strategy, "rate")
    if stype == "synchronous":
        mode, arrival, conc = "closed", "synchronous", 1
    elif stype == "concurrent":
        mode, arrival = "closed", "concurrency"
        conc = ctx.int_(strategy, "streams") or ctx.int_(strategy, "max_concurrency")
    elif stype == "throughput":
        mode, arrival = "offline", "burst"
        conc = ctx.int_(strategy, "max_concurrency")
    elif stype in ("constant", "poisson"):
        mode, arrival = "open", stype
        conc = ctx.to_int(ctx.as_num(profile_conc, "profile.max_concurrency"), "max_concurrency")
    elif stype in ("trace", "replay"):
        mode, arrival, conc = "open", "trace", None
        rate = None
    else:
        raise ctx.fail("strategy.type_", f"unknown guidellm strategy {stype!r}")
    v["load_mode"], v["arrival_process"], v["concurrency"] = mode, arrival, conc
    v["offered_rate_rps"] = (
        rate if mode == "open" else (float("inf") if mode == "offline" else None)
    )
    completed = ctx.int_(totals, "successful", label="request_totals.successful")
    errored = ctx.int_(totals, "errored", label="request_totals.errored")
    incomplete = ctx.int_(totals, "incomplete", label="request_totals.incomplete")
    v["completed"], v["failed"], v["incomplete"] = completed, errored, incomplete
    v["num_requests"] = ctx.int_(totals, "total", label="request_totals.total")
    v["duration_s"] = ctx.num(bench, "duration")
    v["duration_kind"] = "measure_window"
    start = ctx.num(bench, "start_time")
    started = epoch_to_utc(ctx, start, "start_time")
    v["started_at"] = started
    v["run_date"] = None if started is None else started.date()

    def mean(name: str) -> float | None:
        succ = _status_block(ctx, metrics, name)
        return ctx.num(succ, "mean", label=f"metrics.{name}.successful.mean") if succ else None

    def total(name: str) -> int | None:
        succ = _status_block(ctx, metrics, name)
        if not succ:
            return None
        value = ctx.num(succ, "total_sum", label=f"metrics.{name}.successful.total_sum")
        return ctx.rounded(value, f"metrics.{name}.successful.total_sum")

    v["request_throughput_rps"] = mean("requests_per_second")
    v["input_tokens_per_s"] = mean("prompt_tokens_per_second")
    v["output_tokens_per_s"] = mean("output_tokens_per_second")
    v["total_tokens_per_s"] = mean("tokens_per_second")
    v["mean_concurrency"] = mean("request_concurrency")
    v["total_input_tokens"] = total("prompt_token_count")
    v["total_output_tokens"] = total("output_token_count")
    v["output_tokens_source"] = "server_usage"
    native: dict[str, float | None] = {}
    for name, scale, prefix in (
        ("time_to_first_token_ms", 1.0, "ttft"),
        ("inter_token_latency_ms", 1.0, "tpot"),
        ("request_latency", 1000.0, "e2e"),
        ("time_per_output_token_ms", 1.0, "guidellm_time_per_output_token"),
        ("time_to_first_output_token_ms", 1.0, "guidellm_time_to_first_output_token"),
    ):
        native.update({f"{k}_ms": x for k, x in _dist(ctx, metrics, name, scale, prefix).items()})
    point.native = native
    for src, dst in (
        ("prompt_token_count", "input_tokens"),
        ("output_token_count", "output_tokens"),
    ):
        stats = _dist(ctx, metrics, src, 1.0, dst)
        v[f"{dst}_mean"] = stats.get(f"{dst}_mean")
        v[f"{dst}_p50"] = stats.get(f"{dst}_p50")
        v[f"{dst}_p99"] = stats.get(f"{dst}_p99")
        succ = _status_block(ctx, metrics, src)
        lo = ctx.num(succ, "min", label=f"metrics.{src}.successful.min") if succ else None
        hi = ctx.num(succ, "max", label=f"metrics.{src}.successful.max") if succ else None
        if lo is not None and hi is not None:
            v[f"{dst.replace('_tokens', '')}_len_fixed"] = lo == hi
    point.file_metadata["strategy"] = json.loads(json.dumps(strategy, default=str))
    return point


def _listed(bench: Mapping[str, Any]) -> int | None:
    requests = bench.get("requests")
    if not isinstance(requests, dict):
        return None
    succ = requests.get("successful")
    return len(succ) if isinstance(succ, list) else None


def _read_g1(path_ctx: Ctx, reports: list[Any]) -> list[RawPoint]:
    """G1 (v0.1.x): ``benchmarks[i].benchmarks[j]`` = ``{mode, rate, results[], errors[]}`` with
    raw per-request results only; every statistic is computed here from them."""
    points: list[RawPoint] = []
    index = 0
    for i, report in enumerate(reports):
        rctx = Ctx(path_ctx.path, f"benchmarks[{i}]")
        if not isinstance(report, dict) or not isinstance(report.get("benchmarks"), list):
            raise rctx.fail("benchmarks", "expected a v0.1 report with a 'benchmarks' list")
        args = rctx.dict_(report, "args")
        for j, bench in enumerate(report["benchmarks"]):
            ctx = Ctx(path_ctx.path, f"benchmarks[{i}].benchmarks[{j}]")
            if not isinstance(bench, dict):
                raise ctx.fail("benchmarks", f"element is {type(bench).__name__}, not an object")
            points.append(_g1_benchmark(ctx, bench, args, index))
            index += 1
    return points


def _g1_benchmark(
    ctx: Ctx, bench: Mapping[str, Any], args: Mapping[str, Any], index: int
) -> RawPoint:
    point = RawPoint(record_index=index)
    v = point.values
    v["source_schema"] = "guidellm-G1"
    model = args.get("model")
    v["model"] = None if model is None else str(model)
    mode = ctx.str_(bench, "mode")
    rate = ctx.num(bench, "rate")
    if mode == "synchronous":
        v["load_mode"], v["arrival_process"], v["concurrency"] = "closed", "synchronous", 1
    elif mode == "throughput":
        v["load_mode"], v["arrival_process"], v["offered_rate_rps"] = "offline", "burst", math.inf
    elif mode == "asynchronous":
        rate_type = str(args.get("rate_type", "")).lower()
        v["load_mode"], v["offered_rate_rps"] = "open", rate
        v["arrival_process"] = rate_type if rate_type in ("constant", "poisson") else "unknown"
    else:
        raise ctx.fail("mode", f"unknown guidellm v0.1 mode {mode!r}")
    results = bench.get("results") or []
    errors = bench.get("errors") or []
    if not isinstance(results, list) or not isinstance(errors, list):
        raise ctx.fail("results", "expected lists 'results' and 'errors'")
    cols: dict[str, list[Any]] = {
        k: []
        for k in ("ok", "start_s", "ttft_ms", "e2e_ms", "itl_ms", "input_tokens", "output_tokens")
    }
    starts: list[float | None] = []
    ends: list[float] = []
    for k, res in enumerate(results):
        if not isinstance(res, dict):
            raise ctx.fail(f"results[{k}]", "expected an object")
        start = ctx.num(res, "start_time", label=f"results[{k}].start_time")
        end = ctx.num(res, "end_time", label=f"results[{k}].end_time")
        first = ctx.num(res, "first_token_time", label=f"results[{k}].first_token_time")
        decode = ctx.dict_(res, "decode_times")
        gaps = ctx.num_list(decode, "data") or []
        cols["ok"].append(True)
        starts.append(start)
        if end is not None:
            ends.append(end)
        cols["ttft_ms"].append(None if first is None else first * 1000.0)
        cols["e2e_ms"].append(None if start is None or end is None else (end - start) * 1000.0)
        cols["itl_ms"].append([g * 1000.0 for g in gaps if g is not None])
        cols["input_tokens"].append(ctx.int_(res, "prompt_token_count"))
        cols["output_tokens"].append(ctx.int_(res, "output_token_count"))
    for _ in errors:
        for key in cols:
            cols[key].append(False if key == "ok" else ([] if key == "itl_ms" else None))
        starts.append(None)
    t0 = min((x for x in starts if x is not None), default=None)
    cols["start_s"] = [None if x is None or t0 is None else x - t0 for x in starts]
    point.per_request = with_tpot(per_request_frame(cols, len(cols["ok"])))
    v["completed"], v["failed"] = len(results), len(errors)
    v["num_requests"] = len(results) + len(errors)
    if t0 is not None and ends:
        v["duration_s"] = max(ends) - t0
        v["duration_kind"] = "first_send_to_last_done"
        if v["duration_s"] > 0:
            v["request_throughput_rps"] = len(results) / v["duration_s"]
            out_total = sum(x for x in cols["output_tokens"] if x is not None)
            v["output_tokens_per_s"] = out_total / v["duration_s"]
            v["total_output_tokens"] = out_total
        started = epoch_to_utc(ctx, t0, "results[].start_time")
        v["started_at"] = started
        v["run_date"] = None if started is None else started.date()
    v["output_tokens_source"] = "unknown"
    point.notes.append("guidellm v0.1 report: every statistic recomputed from the raw results")
    return point


def detect(path: Path, record: Any) -> str | None:
    return TOOL if isinstance(record, dict) and isinstance(record.get("benchmarks"), list) else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="guidellm",
    files="benchmarks.json or benchmarks.yaml",
    needs="an object whose `benchmarks` is a list",
    detect=detect,
    read=read,
)
