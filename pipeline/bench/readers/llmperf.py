"""ray-project llmperf ``<name>_summary.json`` (+ ``<name>_individual_responses.json``):
flattened ``results_<metric>_<stat>`` keys in seconds, a closed loop at
``num_concurrent_requests``. Its ``inter_token_latency_s`` includes the TTFT and matches neither
ITL nor TPOT, so tpot comes only from the individual responses, when present. Fields, quirks and
upstream sources: docs/bench.md#llmperf.
"""

from __future__ import annotations

import math
import re
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
    epoch_to_utc,
    first_object,
    keep_free_form,
    per_request_frame,
    truncate_error,
    whole_document,
    with_tpot,
)
from pipeline.errors import InputFormatError
from pipeline.safe_read import parse_json

TOOL = "llmperf"
SUMMARY_SUFFIX = "_summary.json"
INDIVIDUAL_SUFFIX = "_individual_responses.json"
_RESULT_KEY = re.compile(r"^results_")
KNOWN_KEYS = frozenset(
    {
        "version",
        "name",
        "model",
        "mean_input_tokens",
        "stddev_input_tokens",
        "mean_output_tokens",
        "stddev_output_tokens",
        "num_concurrent_requests",
        "additional_sampling_params",
        "timestamp",
    }
)

#: ``--metadata`` keys kept in ``file_metadata`` (as the llmperf leaderboard writes them); any
#: other unknown key is dropped with a note (it may be content).
METADATA_KEYS = frozenset({"framework", "model_size"})


def _quantiles(
    ctx: Ctx, obj: Mapping[str, Any], metric: str, prefix: str, scale: float
) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    base = f"results_{metric}"
    for stat, key in (
        ("mean", f"{base}_mean"),
        ("p50", f"{base}_quantiles_p50"),
        ("p90", f"{base}_quantiles_p90"),
        ("p95", f"{base}_quantiles_p95"),
        ("p99", f"{base}_quantiles_p99"),
        ("max", f"{base}_max"),
    ):
        value = ctx.num(obj, key)
        if key in obj:
            out[f"{prefix}_{stat}"] = None if value is None else value * scale
    return out


def individual_path(summary: Path) -> Path | None:
    if not summary.name.endswith(SUMMARY_SUFFIX):
        return None
    return summary.with_name(summary.name[: -len(SUMMARY_SUFFIX)] + INDIVIDUAL_SUFFIX)


def read(ctx: Ctx, obj: Mapping[str, Any]) -> RawPoint:
    point = RawPoint(record_index=0)
    v = point.values
    version = ctx.str_(obj, "version")
    v["source_schema"] = f"llmperf-{version}" if version else "llmperf"
    v["model"] = ctx.str_(obj, "model")
    v["load_mode"], v["arrival_process"] = "closed", "concurrency"
    v["concurrency"] = ctx.int_(obj, "num_concurrent_requests")
    completed = ctx.int_(obj, "results_num_completed_requests")
    v["completed"] = completed
    v["failed"] = ctx.int_(obj, "results_number_errors")
    v["num_requests"] = ctx.int_(obj, "results_num_requests_started")
    per_min = ctx.num(obj, "results_num_completed_requests_per_min")
    thr = None if per_min is None else per_min / 60.0
    v["request_throughput_rps"] = thr
    if completed is not None and thr:
        v["duration_s"] = completed / thr
        v["duration_kind"] = "derived"
    v["output_tokens_per_s"] = ctx.num(obj, "results_mean_output_throughput_token_per_s")
    v["output_tokens_source"] = "client_retokenized"
    native: dict[str, float | None] = {}
    for metric, prefix in (("ttft_s", "ttft"), ("end_to_end_latency_s", "e2e")):
        native.update(
            {f"{k}_ms": x for k, x in _quantiles(ctx, obj, metric, prefix, 1000.0).items()}
        )
    native.update(
        {
            f"{k}_ms": x
            for k, x in _quantiles(
                ctx, obj, "inter_token_latency_s", "llmperf_inter_token_latency", 1000.0
            ).items()
        }
    )
    point.native = native
    for metric, side in (("number_input_tokens", "input"), ("number_output_tokens", "output")):
        q = _quantiles(ctx, obj, metric, f"{side}_tokens", 1.0)
        for stat in ("mean", "p50", "p99"):
            v[f"{side}_tokens_{stat}"] = q.get(f"{side}_tokens_{stat}")
        lo = ctx.num(obj, f"results_{metric}_min")
        hi = ctx.num(obj, f"results_{metric}_max")
        if lo is not None and hi is not None:
            v[f"{side}_len_fixed"] = lo == hi
        mean = v.get(f"{side}_tokens_mean")
        if mean is not None and completed is not None and math.isfinite(mean):
            total = ctx.rounded(mean * completed, f"results_{metric}_mean × completed")
            v[f"total_{side}_tokens"] = total
    v["input_len_target"] = ctx.int_(obj, "mean_input_tokens")
    v["output_len_target"] = ctx.int_(obj, "mean_output_tokens")
    ts = ctx.num(obj, "timestamp")
    started = epoch_to_utc(ctx, ts, "timestamp")
    v["started_at"] = started
    v["run_date"] = None if started is None else started.date()
    free_form = {
        k: val for k, val in obj.items() if k not in KNOWN_KEYS and not _RESULT_KEY.match(k)
    }
    keep_free_form(point, free_form, METADATA_KEYS)
    ind = individual_path(ctx.path)
    if ind is not None and ind.is_file():
        point.per_request = read_individual(
            ind, point.read_companion(ind, "llmperf individual responses")
        )
        point.notes.append(f"ttft/e2e/tpot recomputed from {ind.name}")
    return point


def read_individual(path: Path, text: str) -> pl.DataFrame:
    """Per-request rows of llmperf's individual responses (``text``, read from ``path``)."""
    try:
        doc = parse_json(text, path, strict=False)
    except InputFormatError as exc:
        raise BenchFormatError(f"cannot read llmperf individual responses: {exc}") from exc
    if not isinstance(doc, list):
        raise BenchFormatError(f"{path}: llmperf individual responses must be a JSON list")
    cols: dict[str, list[Any]] = {
        k: [] for k in ("ok", "error", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens")
    }
    for i, rec in enumerate(doc):
        ctx = Ctx(path, f"record {i}")
        if not isinstance(rec, dict):
            raise ctx.fail("<record>", f"expected an object, got {type(rec).__name__}")
        code = rec.get("error_code")
        msg = rec.get("error_msg")
        ok = code is None and not msg
        cols["ok"].append(ok)
        cols["error"].append(truncate_error(msg) if not ok else None)
        ttft = ctx.num(rec, "ttft_s")
        e2e = ctx.num(rec, "end_to_end_latency_s")
        cols["ttft_ms"].append(None if ttft is None or not ok else ttft * 1000.0)
        cols["e2e_ms"].append(None if e2e is None or not ok else e2e * 1000.0)
        cols["input_tokens"].append(ctx.int_(rec, "number_input_tokens"))
        cols["output_tokens"].append(ctx.int_(rec, "number_output_tokens"))
    return with_tpot(per_request_frame(cols, len(doc)))


def detect(path: Path, record: Any) -> str | None:
    if isinstance(record, dict):
        summary = "results_ttft_s_mean" in record or record.get("version") == "2023-08-31"
        return TOOL if summary else None
    first = first_object(record)
    return "llmperf_requests" if first is not None and "ttft_s" in first else None


FORMAT = BenchFormat(
    tool=TOOL,
    title="llmperf",
    files="*_summary.json",
    needs='`results_ttft_s_mean`, or `version` is `"2023-08-31"`',
    detect=detect,
    read=whole_document(read),
    companions=(
        Companion(
            "llmperf_requests",
            "a list of objects, the first with `ttft_s`",
            "llmperf individual responses (read beside its *_summary.json); "
            "not a load point by itself",
        ),
    ),
)
