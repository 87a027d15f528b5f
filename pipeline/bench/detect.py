"""Parse a benchmark result file and tell which tool wrote it — by content, never by extension.

Parsing (:func:`load_document`): a stream of JSON values in one pass (bare ``Infinity``/``NaN``
accepted, as SGLang writes them) — one value is a JSON document, several are JSON Lines (vLLM
``--append-result`` writes JSONL into a ``.json`` file); text that does not start with ``{`` or
``[`` as YAML (guidellm ``benchmarks.yaml``, inference-perf
``config.yaml``).

Detection (:func:`detect_kind`, docs/bench.md#detection-which-tool-wrote-a-file) on each record:

=========================  ==================================================================
kind                       rule
=========================  ==================================================================
``guidellm``               object with a ``benchmarks`` list
``inference_perf_stage``   ``load_summary`` + ``successes`` (+ ``failures``), file
                           ``stage_<N>_…`` or ``load_summary.requested_rate``/``concurrency``
``inference_perf_summary`` same keys, file ``summary_…`` or no rate → cross-stage aggregate
``inference_perf_config``  object with ``load`` and ``server`` (the run's ``config.yaml``)
``inference_perf_requests`` list of objects with ``start_time``/``end_time``/``info``
``genai_perf_raw``         ``experiments`` list (+ ``service_kind``): perf_analyzer export
``aiperf``                 ``time_to_first_token`` is ``{unit: …}`` and an aiperf marker key
``genai_perf``             ``time_to_first_token`` is ``{unit: …}`` otherwise
``aiperf_requests``        ``metadata.request_start_ns`` (aiperf ``profile_export.jsonl`` line)
``llmperf_summary``        ``results_ttft_s_mean`` or ``version == "2023-08-31"``
``llmperf_requests``       list of objects with ``ttft_s``
``vllm_sweep_summary``     list of objects with ``*_ttft_ms`` (``vllm bench sweep``
                           ``summary.json``: copies of the ``run=<k>.json`` files)
``sglang_bench_serving``   ``*_ttft_ms`` + an SGLang marker, no ``burstiness``/``*_e2el_ms``
``vllm_bench_serve``       ``*_ttft_ms`` otherwise
=========================  ==================================================================
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputFormatError
from pipeline.safe_read import check_depth, too_deep
from pipeline.settings import parse_yaml


class BenchFormatError(InputFormatError):
    """A benchmark result file matches no known format, or cannot be parsed."""


FORMATS_TRIED = (
    "vLLM bench serve JSON/JSONL, SGLang bench_serving JSONL, guidellm benchmarks.json/.yaml, "
    "genai-perf profile_export_genai_perf.json / profile_export.json, aiperf "
    "profile_export_aiperf.json / profile_export.jsonl, llmperf *_summary.json / "
    "*_individual_responses.json, inference-perf stage_N_lifecycle_metrics.json / config.yaml"
)
_TTFT_MS = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_ttft_ms$")
_E2EL = re.compile(r"_e2el_ms$")
_SGLANG_MARKERS = (
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "total_output_tokens_retokenized",
    "accept_length",
    "dataset_name",
    "server_info",
    "total_input",
    "total_output",
)
_AIPERF_MARKERS = (
    "aiperf_version",
    "schema_version",
    "benchmark_duration",
    "was_cancelled",
    "error_summary",
    "telemetry_data",
    "inter_chunk_latency",
    "error_request_count",
)
_WS = re.compile(r"\s*")
_STAGE_NAME = re.compile(r"^stage_(\d+)_lifecycle_metrics\.json$")


@dataclass(frozen=True)
class Document:
    """A parsed file: ``records`` is one element for a JSON/YAML document, one per line for JSONL;
    ``line_numbers`` are the 1-based text lines of the records (1 for a single document)."""

    path: Path
    text_format: str  # "json" | "jsonl" | "yaml"
    records: list[Any]
    line_numbers: list[int]
    raw: bytes


def load_document(path: Path) -> Document:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BenchFormatError(f"{path}: cannot read benchmark file: {exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BenchFormatError(
            f"{path}: not a text file (UTF-8 decode failed at byte {exc.start}); "
            f"formats tried: {FORMATS_TRIED}"
        ) from exc
    stripped = text.lstrip()
    if not stripped:
        raise BenchFormatError(f"{path}: empty file; formats tried: {FORMATS_TRIED}")
    if stripped[0] not in "{[":
        return _load_yaml(path, text, raw)
    return _load_json_stream(path, text, raw)


def _load_json_stream(path: Path, text: str, raw: bytes) -> Document:
    """One JSON document, or several concatenated/line-delimited ones, in a single pass."""
    decoder = json.JSONDecoder()
    records: list[Any] = []
    numbers: list[int] = []
    idx, line, counted_to = 0, 1, 0
    while True:
        idx = _WS.match(text, idx).end()  # type: ignore[union-attr]
        if idx >= len(text):
            break
        line += text.count("\n", counted_to, idx)
        counted_to = idx
        try:
            obj, end = decoder.raw_decode(text, idx)
        except RecursionError as exc:
            raise BenchFormatError(str(too_deep(path))) from exc
        except json.JSONDecodeError as exc:
            if not records:
                raise BenchFormatError(
                    f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column "
                    f"{exc.colno}) — truncated or corrupt?; formats tried: {FORMATS_TRIED}"
                ) from exc
            raise BenchFormatError(
                f"{path}: line {line}: not valid JSON ({exc.msg} at column {exc.colno}); "
                "the file is JSON Lines (one result object per line) — truncated?"
            ) from exc
        _check_depth(obj, path)
        records.append(obj)
        numbers.append(line)
        idx = end
    return Document(path, "json" if len(records) == 1 else "jsonl", records, numbers, raw)


def _load_yaml(path: Path, text: str, raw: bytes) -> Document:
    try:
        doc = parse_yaml(text)
    except RecursionError as exc:
        raise BenchFormatError(str(too_deep(path))) from exc
    except yaml.YAMLError as exc:
        raise BenchFormatError(
            f"{path}: neither JSON nor valid YAML ({exc}); formats tried: {FORMATS_TRIED}"
        ) from exc
    if not isinstance(doc, (dict, list)):
        raise BenchFormatError(
            f"{path}: content is not a JSON/YAML object or list; formats tried: {FORMATS_TRIED}"
        )
    _check_depth(doc, path)
    return Document(path, "yaml", [doc], [1], raw)


def _check_depth(record: Any, path: Path) -> None:
    try:
        check_depth(record, path)
    except InputFormatError as exc:
        raise BenchFormatError(str(exc)) from exc


def stage_number(path: Path) -> int | None:
    m = _STAGE_NAME.match(path.name)
    return int(m.group(1)) if m else None


def detect_record(path: Path, obj: Any) -> str | None:
    """The kind of one parsed record, or None when it matches nothing."""
    if isinstance(obj, list):
        dicts = [x for x in obj if isinstance(x, dict)]
        if obj and len(dicts) == len(obj):
            if "ttft_s" in dicts[0]:
                return "llmperf_requests"
            if any(_TTFT_MS.match(str(k)) for k in dicts[0]):
                return "vllm_sweep_summary"
            if {"start_time", "end_time"} <= dicts[0].keys() and "info" in dicts[0]:
                return "inference_perf_requests"
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("benchmarks"), list):
        return "guidellm"
    if "load_summary" in obj and "successes" in obj:
        if path.name.startswith("summary_"):
            return "inference_perf_summary"
        if stage_number(path) is not None:
            return "inference_perf_stage"
        load = obj["load_summary"] if isinstance(obj["load_summary"], dict) else {}
        if "requested_rate" in load or "concurrency" in load:
            return "inference_perf_stage"
        return "inference_perf_summary"
    if isinstance(obj.get("experiments"), list):
        return "genai_perf_raw"
    ttft = obj.get("time_to_first_token")
    if isinstance(ttft, dict) and "unit" in ttft:
        input_config = obj.get("input_config")
        ic = input_config if isinstance(input_config, dict) else {}
        if any(k in obj for k in _AIPERF_MARKERS) or "loadgen" in ic or "models" in ic:
            return "aiperf"
        return "genai_perf"
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "request_start_ns" in meta:
        return "aiperf_requests"
    if "results_ttft_s_mean" in obj or obj.get("version") == "2023-08-31":
        return "llmperf_summary"
    if any(_TTFT_MS.match(str(k)) for k in obj):
        has_e2el = any(_E2EL.search(str(k)) for k in obj)
        sglang_like = any(k in obj for k in _SGLANG_MARKERS) or (
            "concurrency" in obj and "burstiness" not in obj
        )
        if sglang_like and "burstiness" not in obj and not has_e2el:
            return "sglang_bench_serving"
        return "vllm_bench_serve"
    if "load" in obj and "server" in obj and isinstance(obj.get("load"), dict):
        return "inference_perf_config"
    return None


def detect_kind(doc: Document) -> str:
    """The kind of a whole document; every JSONL record must be the same kind."""
    kinds: list[str] = []
    for i, rec in enumerate(doc.records):
        kind = detect_record(doc.path, rec)
        where = f"line {doc.line_numbers[i]}: " if doc.text_format == "jsonl" else ""
        if kind is None:
            keys = sorted(str(k) for k in rec)[:12] if isinstance(rec, dict) else []
            raise BenchFormatError(
                f"{doc.path}: {where}unrecognised benchmark result (top-level keys {keys}); "
                f"formats tried: {FORMATS_TRIED}"
            )
        kinds.append(kind)
    distinct = sorted(set(kinds))
    if len(distinct) > 1:
        raise BenchFormatError(f"{doc.path}: JSON Lines mix result formats {distinct}")
    return kinds[0]
