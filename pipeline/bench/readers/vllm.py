"""vLLM ``vllm bench serve`` / ``benchmarks/benchmark_serving.py`` result JSON: one object per
run, one per line with ``--append-result`` (JSON Lines even when named ``.json``). Latencies are
ms, per-request arrays seconds; when the arrays are present every family is recomputed from
them. Fields, quirks and upstream sources: docs/bench.md#vllm-bench-serve.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.bench.manifest import ENGINE_ARG_TYPES
from pipeline.bench.readers._common import (
    BenchFormat,
    Companion,
    Ctx,
    RawPoint,
    first_object,
    keep_free_form,
    per_request_frame,
    read_records,
    record_engine_args,
    truncate_error,
    with_tpot,
)

TOOL = "vllm_bench_serve"
METRIC_KEY = re.compile(
    r"^(mean|median|std|p(\d+(?:\.\d+)?))_"
    r"(ttft|tpot|itl|e2el|e2e_latency|client_queue_time|e2el_including_client_queue)_ms$"
)
_FAMILY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e", "e2e_latency": "e2e"}
_PCT_COLUMNS = {"50": "p50", "90": "p90", "95": "p95", "99": "p99"}
PER_REQUEST_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "errors",
    "generated_texts",
)
KNOWN_KEYS = frozenset(
    {
        "date",
        "endpoint_type",
        "backend",
        "label",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "ramp_up_strategy",
        "ramp_up_start_rps",
        "ramp_up_end_rps",
        "rps_change_events",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "request_goodput:",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "rtfx",
        "run_number",
        *PER_REQUEST_KEYS,
    }
)


#: ``--metadata KEY=VALUE`` keys kept in ``file_metadata`` (hints about the deployment, as the
#: llm-d benchmark harness writes them); any other unknown key is dropped (it may be content).
METADATA_KEYS = frozenset(
    {
        "gpu",
        "deployment",
        "gateway",
        "decode_replicas",
        "prefill_replicas",
        "input_len",
        "output_len",
        "model",
    }
)


def latency_native(ctx: Ctx, obj: Mapping[str, Any]) -> dict[str, float | None]:
    """Native latency aggregates under normalised names (all ms already)."""
    out: dict[str, float | None] = {}
    for key in obj:
        m = METRIC_KEY.match(str(key))
        if not m:
            continue
        stat, pct, metric = m.group(1), m.group(2), m.group(3)
        family = _FAMILY.get(metric)
        value = ctx.num(obj, key)
        if family is None:  # client queue times: keep as tool-only figures
            out[f"{metric}_{stat}_ms"] = value
            continue
        if stat == "mean":
            out[f"{family}_mean_ms"] = value
        elif stat == "median":
            out[f"{family}_p50_ms"] = value
        elif stat == "std":
            out[f"{family}_std_ms"] = value
        elif pct is not None:
            name = _PCT_COLUMNS.get(pct[:-2] if pct.endswith(".0") else pct, f"p{pct}")
            out[f"{family}_{name}_ms"] = value
    if "max_itl_ms" in obj:
        out["itl_max_ms"] = ctx.num(obj, "max_itl_ms")
    return out


def serving_per_request(ctx: Ctx, container: Mapping[str, Any]) -> pl.DataFrame | None:
    """Per-request frame from vLLM/SGLang-style arrays (seconds → ms), or None when absent."""
    ttfts = ctx.num_list(container, "ttfts")
    if ttfts is None:
        return None
    n = len(ttfts)
    itls = ctx.nested_num_list(container, "itls")
    latencies = ctx.num_list(container, "latencies")
    starts = ctx.num_list(container, "start_times")
    in_lens = ctx.num_list(container, "input_lens")
    out_lens = ctx.num_list(container, "output_lens")
    errors_raw = container.get("errors")
    if errors_raw is not None and not isinstance(errors_raw, list):
        raise ctx.fail("errors", f"expected a list, got {type(errors_raw).__name__}")
    for name, arr in (
        ("itls", itls),
        ("latencies", latencies),
        ("start_times", starts),
        ("input_lens", in_lens),
        ("output_lens", out_lens),
        ("errors", errors_raw),
    ):
        if arr is not None and len(arr) != n:
            raise ctx.fail(name, f"has {len(arr)} entries but 'ttfts' has {n}")
    errors = [truncate_error(e) for e in errors_raw] if errors_raw is not None else [None] * n
    ok = [e is None for e in errors]
    first = min((s for s in starts or [] if s is not None), default=None)
    frame = per_request_frame(
        {
            "ok": ok,
            "error": errors,
            "ttft_ms": [
                t * 1000.0 if t is not None and k else None for t, k in zip(ttfts, ok, strict=True)
            ],
            "e2e_ms": (
                [
                    x * 1000.0 if x is not None and k else None
                    for x, k in zip(latencies, ok, strict=True)
                ]
                if latencies is not None
                else None
            ),
            "itl_ms": itls,  # seconds here; scaled to ms below in one polars expression
            "start_s": (
                [s - first if s is not None and first is not None else None for s in starts]
                if starts is not None
                else None
            ),
            "input_tokens": [ctx.to_int(v, "input_lens") for v in in_lens] if in_lens else None,
            "output_tokens": (
                [ctx.to_int(v, "output_lens") for v in out_lens] if out_lens else None
            ),
        },
        n,
    )
    frame = frame.with_columns(pl.col("itl_ms").list.eval(pl.element() * 1000.0))
    return with_tpot(frame)


def send_rate(frame: pl.DataFrame) -> float | None:
    """(n − 1) / (last start − first start) over all sent requests; None without start times."""
    starts = frame.get_column("start_s").drop_nulls()
    if starts.len() < 2:
        return None
    span = float(starts.max()) - float(starts.min())  # type: ignore[arg-type]
    return (starts.len() - 1) / span if span > 0 else None


def load_shape(
    rate: float | None, max_concurrency: int | None, burstiness: float | None, ramp: bool
) -> tuple[str, str]:
    """(load_mode, arrival_process) for a rate/concurrency pair of a serving benchmark."""
    if ramp:
        return "open", "ramp"
    if rate is None or math.isinf(rate):
        return ("closed", "concurrency") if max_concurrency is not None else ("offline", "burst")
    if burstiness is None or burstiness == 1.0:
        return "open", "poisson"
    return "open", "gamma"


def read_record(ctx: Ctx, obj: Mapping[str, Any], index: int) -> RawPoint:
    point = RawPoint(record_index=index)
    v = point.values
    early = "request_goodput:" in obj or "failed" not in obj
    v["source_schema"] = "vllm-2025-early" if early else "vllm"
    v["model"] = ctx.str_(obj, "model_id")
    backend = ctx.str_(obj, "backend")
    endpoint = ctx.str_(obj, "endpoint_type")
    v["client_protocol"] = backend if endpoint is None or endpoint == backend else endpoint
    point.file_label = ctx.str_(obj, "label")
    date = ctx.str_(obj, "date")
    if date is not None:
        try:
            v["run_date"] = dt.datetime.strptime(date, "%Y%m%d-%H%M%S").date()
        except ValueError as exc:
            raise ctx.fail("date", f"expected YYYYmmdd-HHMMSS, got {date!r}") from exc
    rate = ctx.num(obj, "request_rate")
    max_conc = ctx.int_(obj, "max_concurrency")
    burst = ctx.num(obj, "burstiness")
    ramp = obj.get("ramp_up_strategy") is not None
    mode, arrival = load_shape(rate, max_conc, burst, ramp)
    v["load_mode"], v["arrival_process"] = mode, arrival
    v["offered_rate_rps"] = None if mode == "closed" or ramp else rate
    if ramp:
        point.notes.append(
            f"ramp-up run ({obj.get('ramp_up_strategy')}: "
            f"{obj.get('ramp_up_start_rps')}→{obj.get('ramp_up_end_rps')} req/s): no single "
            "offered rate"
        )
    v["burstiness"] = burst
    v["concurrency"] = max_conc
    completed = ctx.int_(obj, "completed")
    num_prompts = ctx.int_(obj, "num_prompts")
    failed = ctx.int_(obj, "failed")
    v["completed"] = completed
    v["num_requests"] = num_prompts
    v["duration_s"] = ctx.num(obj, "duration")
    v["duration_kind"] = "first_send_to_last_done"
    v["total_input_tokens"] = ctx.int_(obj, "total_input_tokens")
    v["total_output_tokens"] = ctx.int_(obj, "total_output_tokens")
    v["output_tokens_source"] = "unknown"  # server usage when streamed, else re-tokenised
    v["request_throughput_rps"] = ctx.num(obj, "request_throughput")
    v["output_tokens_per_s"] = ctx.num(obj, "output_throughput")
    v["total_tokens_per_s"] = ctx.num(obj, "total_token_throughput")
    duration = v["duration_s"]
    if v["total_input_tokens"] is not None and duration:
        # vLLM's own definition: total_token_throughput = (input + output tokens) / duration
        v["input_tokens_per_s"] = v["total_input_tokens"] / duration
    goodput_key = "request_goodput" if "request_goodput" in obj else "request_goodput:"
    v["goodput_rps"] = ctx.num(obj, goodput_key)
    point.native = latency_native(ctx, obj)
    frame = serving_per_request(ctx, obj)
    if frame is not None:
        point.per_request = frame
        errors_known = "errors" in obj
        if failed is None and errors_known:
            failed = int(frame.filter(~pl.col("ok")).height)
        if frame.get_column("start_s").null_count() < frame.height:
            v["achieved_rate_rps"] = send_rate(frame)
    if failed is None and num_prompts is not None and completed is not None:
        failed = num_prompts - completed
    v["failed"] = failed
    if num_prompts is None and completed is not None and failed is not None:
        v["num_requests"] = completed + failed
    free_form = {
        k: val
        for k, val in obj.items()
        if k not in KNOWN_KEYS and not METRIC_KEY.match(str(k)) and k != "max_itl_ms"
    }
    # `vllm bench serve --metadata max_num_batched_tokens=2048 …`: the server's own limits.
    limits = {k: v for k, v in free_form.items() if k in ENGINE_ARG_TYPES}
    keep_free_form(point, {k: v for k, v in free_form.items() if k not in limits}, METADATA_KEYS)
    record_engine_args(point, limits, {name: name for name in limits})
    return point


def has_ttft_ms(obj: Mapping[str, Any]) -> bool:
    """A ``{mean,median,std,p<N>}_ttft_ms`` key: the vLLM and SGLang result layout."""
    return any((m := METRIC_KEY.match(str(k))) is not None and m.group(3) == "ttft" for k in obj)


def detect(path: Path, record: Any) -> str | None:
    if isinstance(record, dict) and has_ttft_ms(record):
        return TOOL
    first = first_object(record)
    return "vllm_sweep_summary" if first is not None and has_ttft_ms(first) else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="vLLM bench serve",
    files="JSON or JSON Lines",
    needs="a `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms` or `p<N>_ttft_ms` key",
    detect=detect,
    read=lambda doc: read_records(doc, read_record),
    companions=(
        Companion(
            "vllm_sweep_summary",
            "a list of objects, the first with such a `*_ttft_ms` key",
            "vllm bench sweep summary.json (repeats the run=<k>.json files; read those); "
            "not a load point by itself",
        ),
    ),
    side_files=("*.pytorch.json",),
)
