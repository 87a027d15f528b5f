"""Sidecar manifest: what the benchmark files do not say (engine, version, GPUs, price, date).

Benchmark tools record the *client* side; the engine that served the requests, its version and
the hardware are almost never in the file. A small YAML file beside the results supplies them
(docs/bench.md#the-sidecar-manifest).

File name convention (first match wins for a result file ``<dir>/<name>``):

1. ``<dir>/<name>.manifest.yaml`` — for this one file (e.g. ``results.jsonl.manifest.yaml``);
2. ``<dir>/enginefit-bench.yaml`` — for every result file in the folder;
3. the nearest ``enginefit-bench.yaml`` in up to ``MAX_PARENT_LEVELS`` (3) parent folders — for
   per-run artifact folders (genai-perf, aiperf, llmperf write one folder per load point;
   ``vllm bench sweep`` writes ``<experiment>/<params>/run=<k>.json``).

A manifest passed to :func:`pipeline.bench.read_bench_files` in code is merged *over* the sidecar
(its keys win), so a caller can add a price to sidecars that lack one.

Keys (``engine``, ``gpu_type``, ``gpu_count`` are required after merging)::

    engine: vllm                  # serving engine (vllm, sglang, tensorrt-llm, tgi, llama.cpp …)
    engine_version: 0.11.0        # optional
    backend: pytorch              # optional: the engine's serving backend when it has several
                                  # (TensorRT-LLM: pytorch, its default, or tensorrt, which
                                  # builds an engine per model); decides the model-change cost
    gpu_type: H100-80GB           # accelerator model
    gpu_count: 1                  # accelerators serving this deployment (all replicas), ≤ 100,000
    quantization: bf16            # optional (bf16, fp8, awq-int4 …)
    price_per_gpu_hour_usd: 2.49  # optional, $ per accelerator-hour (0 to 1000)
    run_date: 2025-11-05          # optional; else the date in the file
    model: meta-llama/Llama-3.1-8B-Instruct  # optional; overrides the model in the file
    workload: shared-prefix-64    # optional label of the benchmark workload
    dataset: enginefit-trace      # optional: the prompts' dataset when the file does not say
                                  # (enginefit loadtest writes enginefit-trace: the workload's
                                  # own lengths and prefix structure)
    label: prefix-aware-routing   # optional label for the runs (else see label_from)
    label_from: deployment        # optional: take the label from this free-form file key
    tool_version: 0.5.0           # optional; used when the file has no version
    engine_args:                  # optional: the deployment's scheduling limits, vLLM's names
      max_num_batched_tokens: 2048  # tokens a step may process (prefill budget)
      max_num_seqs: 256             # requests running at once
      enable_chunked_prefill: true  # a long prompt split over steps
      kv_cache_dtype: fp8           # auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, int8 …
      tensor_parallel_size: 1       # GPUs one replica's tensors are split over
      pipeline_parallel_size: 1
      kv_cache_tokens: 450000       # the KV pool, as the engine logs it at start
      gpu_memory_utilization: 0.9
      max_model_len: 16384
    files:                        # optional per-file overrides, fnmatch pattern on the file name
      "stage_*_lifecycle_metrics.json": {engine_version: 0.11.0}

``engine_args`` in a ``files`` entry replaces the folder's whole block for those files.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.costing import MAX_GPU_HOUR_USD, parse_price
from pipeline.errors import ConfigError, InputFormatError, os_reason
from pipeline.settings import load_yaml

DIR_MANIFEST_NAME = "enginefit-bench.yaml"
FILE_MANIFEST_SUFFIX = ".manifest.yaml"
MAX_PARENT_LEVELS = 3
#: The ``dataset`` `enginefit loadtest` writes: the workload's own trace, replayed.
TRACE_DATASET = "enginefit-trace"
#: No benchmarked deployment is larger: a count above this is a typo (or 10^21), not a fleet.
MAX_GPU_COUNT = 100_000
REQUIRED_KEYS: tuple[str, ...] = ("engine", "gpu_type", "gpu_count")
#: A serving backend's name (checked against the engine's backends in the catalog when decided).
BACKEND_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")
_STR_KEYS = (
    "engine",
    "engine_version",
    "backend",
    "gpu_type",
    "quantization",
    "model",
    "workload",
    "dataset",
    "label",
    "label_from",
    "tool_version",
)
KNOWN_KEYS: frozenset[str] = frozenset(
    (*_STR_KEYS, "gpu_count", "price_per_gpu_hour_usd", "run_date", "engine_args", "files")
)
#: The engine arguments a manifest may state, by vLLM's names, and their types (docs/bench.md
#: names each engine's own spelling: SGLang --chunked-prefill-size is max_num_batched_tokens,
#: TensorRT-LLM max_batch_size is max_num_seqs, llama.cpp -np is max_num_seqs …).
ENGINE_ARG_TYPES: dict[str, type] = {
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "enable_chunked_prefill": bool,
    "kv_cache_dtype": str,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "kv_cache_tokens": int,
    "gpu_memory_utilization": float,
    "max_model_len": int,
}
EngineArgs = dict[str, int | float | bool | str]


class BenchManifestError(InputFormatError):
    """A manifest is missing, malformed, or lacks a required key for a result file."""


@dataclass(frozen=True)
class BenchManifest:
    """The validated manifest values that apply to one result file."""

    engine: str
    gpu_type: str
    gpu_count: int
    engine_version: str | None = None
    backend: str | None = None
    quantization: str | None = None
    price_per_gpu_hour_usd: float | None = None
    run_date: dt.date | None = None
    model: str | None = None
    workload: str | None = None
    dataset: str | None = None
    label: str | None = None
    label_from: str | None = None
    tool_version: str | None = None
    engine_args: EngineArgs | None = None
    source: str = "<explicit>"


def sidecar_candidates(result_file: Path) -> list[Path]:
    """Where a sidecar manifest for ``result_file`` is looked for, in order."""
    folder = result_file.parent
    out = [folder / f"{result_file.name}{FILE_MANIFEST_SUFFIX}", folder / DIR_MANIFEST_NAME]
    parent = folder
    for _ in range(MAX_PARENT_LEVELS):
        if parent.parent == parent:
            break
        parent = parent.parent
        out.append(parent / DIR_MANIFEST_NAME)
    return out


def is_manifest_file(path: Path) -> bool:
    return path.name == DIR_MANIFEST_NAME or path.name.endswith(FILE_MANIFEST_SUFFIX)


def find_sidecar(result_file: Path) -> Path | None:
    for candidate in sidecar_candidates(result_file):
        if candidate.is_file():
            return candidate
    return None


def load_manifest(path: Path | str) -> dict[str, Any]:
    """Read a manifest YAML into a raw mapping (keys checked, values validated later)."""
    p = Path(path)
    try:
        # Dates stay text (``run_date: 2025-02-30`` is then named by its key, not a bare
        # ValueError from PyYAML's timestamp parser).
        raw = load_yaml(p.read_text(encoding="utf-8"), f"{p}: manifest")
    except OSError as exc:
        raise BenchManifestError(f"{p}: cannot read manifest: {os_reason(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise BenchManifestError(f"{p}: cannot read manifest: {exc}") from exc
    except ConfigError as exc:
        raise BenchManifestError(str(exc)) from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BenchManifestError(f"{p}: manifest must be a mapping, got {type(raw).__name__}")
    _check_keys(raw, str(p))
    return raw


def _check_keys(raw: Mapping[str, Any], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in KNOWN_KEYS)
    if unknown:
        raise BenchManifestError(
            f"{where}: unknown manifest key(s) {unknown}; known keys: {sorted(KNOWN_KEYS)}"
        )
    files = raw.get("files")
    if files is not None:
        if not isinstance(files, dict):
            raise BenchManifestError(f"{where}: 'files' must map file-name patterns to mappings")
        for pattern, sub in files.items():
            if not isinstance(sub, dict):
                raise BenchManifestError(f"{where}: files[{pattern!r}] must be a mapping")
            if "files" in sub:
                raise BenchManifestError(f"{where}: files[{pattern!r}] cannot nest 'files'")
            _check_keys(sub, f"{where}: files[{pattern!r}]")


def _flatten_for(raw: Mapping[str, Any], file_name: str) -> dict[str, Any]:
    """Top-level keys, then every matching ``files`` pattern in sorted pattern order."""
    out = {k: v for k, v in raw.items() if k != "files"}
    files = raw.get("files") or {}
    for pattern in sorted(files):
        if fnmatch.fnmatch(file_name, pattern):
            out.update(files[pattern])
    return out


def resolve_manifest(
    result_file: Path,
    explicit: Mapping[str, Any] | BenchManifest | Path | str | None,
) -> BenchManifest:
    """The manifest for one result file: sidecar (if any) merged with ``explicit``.

    Raises :class:`BenchManifestError` naming the result file and the missing keys when
    ``engine``, ``gpu_type`` or ``gpu_count`` is not supplied by either.
    """
    merged: dict[str, Any] = {}
    sources: list[str] = []
    sidecar = find_sidecar(result_file)
    if sidecar is not None:
        merged.update(_flatten_for(load_manifest(sidecar), result_file.name))
        sources.append(str(sidecar))
    if explicit is not None:
        if isinstance(explicit, BenchManifest):
            explicit_map: dict[str, Any] = {
                k: v for k, v in explicit.__dict__.items() if k != "source" and v is not None
            }
            label = explicit.source
        elif isinstance(explicit, (str, Path)):
            explicit_map = load_manifest(explicit)
            label = str(explicit)
        else:
            explicit_map = dict(explicit)
            _check_keys(explicit_map, "explicit manifest")
            label = "<explicit>"
        merged.update(_flatten_for(explicit_map, result_file.name))
        sources.append(label)
    missing = [k for k in REQUIRED_KEYS if merged.get(k) in (None, "")]
    if missing:
        looked = ", ".join(str(c) for c in sidecar_candidates(result_file))
        raise BenchManifestError(
            f"{result_file}: benchmark result lacks {missing} — engine and GPU are not in "
            f"benchmark files; write a sidecar manifest (looked for: {looked}) or give one "
            f"with --manifest FILE (configuration key bench.manifest) with keys "
            f"{', '.join(REQUIRED_KEYS)}"
        )
    return validate_manifest(merged, " + ".join(sources) or "<none>")


def validate_manifest(values: Mapping[str, Any], source: str) -> BenchManifest:
    def fail(key: str, why: str) -> BenchManifestError:
        return BenchManifestError(f"{source}: manifest key '{key}' {why} (got {values[key]!r})")

    out: dict[str, Any] = {}
    for key in _STR_KEYS:
        v = values.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise fail(key, "must be a string")
        text = str(v).strip()
        if not text:
            raise fail(key, "must not be empty")
        out[key] = text
    backend = out.get("backend")
    if backend is not None and not BACKEND_NAME.fullmatch(backend):
        raise fail("backend", "must be a backend name such as pytorch or tensorrt")
    if backend is not None:
        out["backend"] = backend.lower()
    count = values.get("gpu_count")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_GPU_COUNT:
        raise fail("gpu_count", f"must be a whole number from 1 to {MAX_GPU_COUNT:,}")
    out["gpu_count"] = count
    price = values.get("price_per_gpu_hour_usd")
    if price is not None:
        try:
            out["price_per_gpu_hour_usd"] = parse_price(price, "price_per_gpu_hour_usd")
        except ConfigError as exc:
            raise fail(
                "price_per_gpu_hour_usd", f"must be a price of 0 to {MAX_GPU_HOUR_USD:g} $/GPU-hour"
            ) from exc
    run_date = values.get("run_date")
    if run_date is not None:
        try:
            out["run_date"] = _date(run_date)
        except ValueError as exc:
            raise fail("run_date", "must be a calendar date YYYY-MM-DD") from exc
    engine_args = values.get("engine_args")
    if engine_args is not None:
        out["engine_args"] = validate_engine_args(engine_args, f"{source}: manifest key")
    return BenchManifest(source=source, **out)


def validate_engine_args(raw: Any, where: str) -> EngineArgs:
    """The ``engine_args`` block checked: known keys (:data:`ENGINE_ARG_TYPES`), each of its
    type (whole numbers ≥ 1, a share in (0, 1], true/false, a dtype name). ``where`` starts the
    one-line error (the manifest)."""
    if not isinstance(raw, dict):
        raise BenchManifestError(
            f"{where} 'engine_args' must be a mapping of engine arguments (got {raw!r})"
        )
    unknown = sorted(str(k) for k in raw if k not in ENGINE_ARG_TYPES)
    if unknown:
        raise BenchManifestError(
            f"{where} 'engine_args' has unknown key(s) {unknown}; known keys: "
            f"{sorted(ENGINE_ARG_TYPES)}"
        )
    out: EngineArgs = {}
    for key, value in sorted(raw.items()):
        kind = ENGINE_ARG_TYPES[key]
        bad = f"{where} 'engine_args.{key}'"
        if kind is bool:
            if not isinstance(value, bool):
                raise BenchManifestError(f"{bad} must be true or false (got {value!r})")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BenchManifestError(f"{bad} must be a whole number ≥ 1 (got {value!r})")
        elif kind is float:
            number = (
                value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            )
            if number is None or not 0 < number <= 1:
                raise BenchManifestError(f"{bad} must be a share in (0, 1] (got {value!r})")
            value = float(number)
        elif not isinstance(value, str) or not value.strip():
            raise BenchManifestError(f"{bad} must be a name such as auto or fp8 (got {value!r})")
        else:
            value = value.strip().lower()
        out[key] = value
    return out


def _date(value: Any) -> dt.date:
    """A date given as a date, a datetime or its ISO text (``2025-11-05``, with or without a
    time); ValueError for anything else, ``2025-02-30`` included."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a date: {value!r}")
    text = value.strip()
    return (
        dt.date.fromisoformat(text) if len(text) == 10 else dt.datetime.fromisoformat(text).date()
    )
