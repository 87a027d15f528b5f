"""SGLang ``python -m sglang.bench_serving --output-file …jsonl`` results: one object per run, one
per line (``"request_rate": Infinity`` is a bare token), in four eras told apart by keys
(:func:`_era`). No era writes a failure count: ``failed`` comes from the ``--output-details``
errors, else it is null. Fields, quirks and upstream sources: docs/bench.md#sglang-bench_serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.bench.readers._common import (
    BenchFormat,
    Ctx,
    RawPoint,
    keep_free_form,
    read_records,
    record_engine_args,
)
from pipeline.bench.readers.vllm import (
    METRIC_KEY,
    has_ttft_ms,
    latency_native,
    load_shape,
    serving_per_request,
)

TOOL = "sglang_bench_serving"
KNOWN_KEYS = frozenset(
    {
        "backend",
        "dataset_name",
        "request_rate",
        "max_concurrency",
        "sharegpt_output_len",
        "random_input_len",
        "random_output_len",
        "random_range_ratio",
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "total_output_tokens_retokenized",
        "total_input",
        "total_output",
        "total_output_retokenized",
        "total_input_text_tokens",
        "total_input_vision_tokens",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "output_throughput_retokenized",
        "total_throughput",
        "total_throughput_retokenized",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "concurrency",
        "accept_length",
        "tag",
        "server_info",
        "details",
        "max_itl_ms",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "generated_texts",
        "errors",
    }
)


def _era(obj: Mapping[str, Any]) -> str:
    if "total_input" in obj or "details" in obj:
        return "sglang-refactor"
    if "server_info" in obj or "tag" in obj or "total_throughput" in obj:
        return "sglang-late-2025"
    if "request_throughput" in obj:
        return "sglang-2025"
    return "sglang-2024"


def read_record(ctx: Ctx, obj: Mapping[str, Any], index: int) -> RawPoint:
    point = RawPoint(record_index=index)
    v = point.values
    v["source_schema"] = _era(obj)
    v["client_protocol"] = ctx.str_(obj, "backend")
    v["dataset"] = ctx.str_(obj, "dataset_name")
    point.file_label = ctx.str_(obj, "tag")
    server_info = ctx.dict_(obj, "server_info")
    model = server_info.get("model_path") or server_info.get("served_model_name")
    v["model"] = None if model is None else str(model)
    raw_rate = obj.get("request_rate")
    if isinstance(raw_rate, str) and raw_rate.strip().lower() == "trace":
        rate: float | None = None
        mode, arrival = "open", "trace"
    else:
        rate = ctx.num(obj, "request_rate")
        max_c = ctx.int_(obj, "max_concurrency")
        mode, arrival = load_shape(rate, max_c, None, False)
    v["load_mode"], v["arrival_process"] = mode, arrival
    v["offered_rate_rps"] = None if mode in ("closed",) or arrival == "trace" else rate
    v["concurrency"] = ctx.int_(obj, "max_concurrency")
    v["mean_concurrency"] = ctx.num(obj, "concurrency")
    completed = ctx.int_(obj, "completed")
    duration = ctx.num(obj, "duration")
    v["completed"] = completed
    v["duration_s"] = duration
    v["duration_kind"] = "first_send_to_last_done"
    tin = "total_input" if "total_input" in obj else "total_input_tokens"
    tout = "total_output" if "total_output" in obj else "total_output_tokens"
    v["total_input_tokens"] = ctx.int_(obj, tin)
    v["total_output_tokens"] = ctx.int_(obj, tout)
    # server usage, or the *requested* length when the backend returns none (TRT: always)
    v["output_tokens_source"] = "unknown"
    thr = ctx.num(obj, "request_throughput")
    if thr is None and completed is not None and duration:
        thr = completed / duration
        point.notes.append("request_throughput derived as completed / duration (not in file)")
    v["request_throughput_rps"] = thr
    v["input_tokens_per_s"] = ctx.num(obj, "input_throughput")
    v["output_tokens_per_s"] = ctx.num(obj, "output_throughput")
    v["total_tokens_per_s"] = ctx.num(obj, "total_throughput")
    tin_v, tout_v = v["total_input_tokens"], v["total_output_tokens"]
    if duration:
        # SGLang's own definitions: <tokens> / duration (absent from older eras)
        if v["input_tokens_per_s"] is None and tin_v is not None:
            v["input_tokens_per_s"] = tin_v / duration
        if v["total_tokens_per_s"] is None and tin_v is not None and tout_v is not None:
            v["total_tokens_per_s"] = (tin_v + tout_v) / duration
    native = latency_native(ctx, obj)
    retok = ctx.num(obj, "total_output_tokens_retokenized")
    if retok is not None:
        native["total_output_tokens_retokenized"] = retok
    point.native = native
    if v["dataset"] == "random":
        in_len = ctx.int_(obj, "random_input_len")
        out_len = ctx.int_(obj, "random_output_len")
        ratio = ctx.num(obj, "random_range_ratio")
        v["input_len_target"], v["output_len_target"] = in_len, out_len
        if ratio is not None:
            v["input_len_fixed"] = v["output_len_fixed"] = ratio >= 1.0
    details = ctx.dict_(obj, "details") if "details" in obj else obj
    frame = serving_per_request(ctx, details)
    if frame is not None:
        point.per_request = frame
        if details.get("errors") is not None:
            failed = int(frame.filter(~pl.col("ok")).height)
            v["failed"] = failed
            v["num_requests"] = frame.height
    if v.get("failed") is None:
        point.notes.append(
            "SGLang files carry no failure count (no --output-details errors): failed is null"
        )
    free_form = {
        k: val for k, val in obj.items() if k not in KNOWN_KEYS and not METRIC_KEY.match(str(k))
    }
    keep_free_form(point, free_form, frozenset())  # SGLang writes no user metadata
    if server_info:
        version = server_info.get("version")
        if version is not None:
            point.file_metadata["server_info.version"] = str(version)
        _record_server_args(point, server_info)
    if rate is not None and math.isnan(rate):
        raise ctx.fail("request_rate", "is NaN")
    return point


#: SGLang's ``/get_server_info`` (its server arguments and scheduler figures, saved by
#: ``bench_serving`` as ``server_info``) → the manifest's ``engine_args`` names.
SERVER_ARGS = {
    "chunked_prefill_size": "max_num_batched_tokens",
    "max_running_requests": "max_num_seqs",
    "max_total_num_tokens": "kv_cache_tokens",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "mem_fraction_static": "gpu_memory_utilization",
    "context_length": "max_model_len",
}


def _record_server_args(point: RawPoint, server_info: Mapping[str, Any]) -> None:
    """The serving limits ``server_info`` records. ``chunked_prefill_size`` ≤ 0 is SGLang's
    "chunked prefill off"; a step's prompt tokens are then bounded by ``max_prefill_tokens``."""
    chunk = server_info.get("chunked_prefill_size")
    values = dict(server_info)
    if isinstance(chunk, (int, float)) and not isinstance(chunk, bool) and chunk <= 0:
        values["chunked_prefill_size"] = server_info.get("max_prefill_tokens")
        point.engine_args["enable_chunked_prefill"] = False
    elif chunk is not None:
        point.engine_args["enable_chunked_prefill"] = True
    record_engine_args(point, values, SERVER_ARGS)


# keys of SGLang's results that vLLM's do not have (vLLM has ``burstiness`` and ``*_e2el_ms``)
_MARKERS = (
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "total_output_tokens_retokenized",
    "accept_length",
    "dataset_name",
    "server_info",
    "total_input",
    "total_output",
    "concurrency",
)


def detect(path: Path, record: Any) -> str | None:
    if not isinstance(record, dict) or "burstiness" in record or not has_ttft_ms(record):
        return None
    if any(str(k).endswith("_e2el_ms") for k in record):
        return None
    return TOOL if any(k in record for k in _MARKERS) else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="SGLang bench_serving",
    files="JSON Lines",
    needs="a `*_ttft_ms` key as vLLM's, one of `"
    + "`, `".join(_MARKERS)
    + "`, and neither `burstiness` nor a `*_e2el_ms` key",
    detect=detect,
    read=lambda doc: read_records(doc, read_record),
    refines=("vllm_bench_serve",),
)
