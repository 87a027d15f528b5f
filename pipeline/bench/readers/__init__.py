"""Read benchmark result files into the normalised load-point table.

:func:`read_bench_files` is the entry point: it expands folders, tells each file's tool from its
content, runs the tool's reader, attaches the sidecar manifest (:mod:`pipeline.bench.manifest`),
recomputes latency statistics from per-request data wherever a file (or its companion file in
the same folder) has it (:mod:`pipeline.bench.percentiles`), and returns a
:class:`~pipeline.bench.schema.BenchReadResult`.

Each module here is one tool's reader and declares its ``FORMAT``
(:class:`~pipeline.bench.readers._common.BenchFormat`): its detection, its reader, its companion
files (read by the result file's reader, skipped with a note when met on their own) and its side
files. :data:`FORMATS` collects them; nothing else names a tool. A result file byte-identical to
one read before (a copy under another name) is the same run: it is read once, with a note, never
counted as a repeat. When a folder is expanded, files that are not JSON/JSONL/YAML are skipped
with a note; a file named explicitly is always detected and fails loudly when it matches no
format.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import math
import pkgutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.bench.detect import BenchFormatError, Document, load_document
from pipeline.bench.manifest import BenchManifest, is_manifest_file, resolve_manifest
from pipeline.bench.percentiles import METHOD, recompute_stats
from pipeline.bench.readers._common import BenchFieldError, BenchFormat, RawPoint
from pipeline.bench.schema import (
    LATENCY_METRICS,
    LATENCY_STATS,
    LOAD_POINT_SCHEMA,
    PER_REQUEST_SCHEMA,
    BenchReadResult,
    conform_load_points,
    conform_per_request,
    rejected_notes,
    screen_measurements,
)
from pipeline.layout import LOADTEST_SIDE_FILES

__all__ = [
    "FORMATS",
    "BenchFieldError",
    "BenchFormatError",
    "detect_kind",
    "expand_paths",
    "read_bench_files",
]

DIR_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml")


def _collect_formats() -> dict[str, BenchFormat]:
    """Every reader module's ``FORMAT``, by tool."""
    formats: dict[str, BenchFormat] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        declared = getattr(module, "FORMAT", None)
        if not isinstance(declared, BenchFormat):
            raise TypeError(f"{module.__name__} declares no FORMAT (a BenchFormat)")
        formats[declared.tool] = declared
    return dict(sorted(formats.items()))


FORMATS = _collect_formats()
ManifestArg = Mapping[str, Any] | BenchManifest | Path | str | None


def expand_paths(paths: Sequence[Path | str] | Path | str) -> tuple[list[Path], list[str]]:
    """Files to read (folders expanded recursively, sorted, de-duplicated) and skip notes."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    out: list[Path] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for item in items:
        p = Path(item)
        if p.is_dir():
            for f in sorted(x for x in p.rglob("*") if x.is_file()):
                if is_manifest_file(f) or f.name in LOADTEST_SIDE_FILES:
                    continue  # read with the results they describe
                if _is_side_file(f.name):
                    notes.append(f"{f}: skipped (tool side file, not a result)")
                    continue
                if f.suffix.lower() not in DIR_SUFFIXES:
                    notes.append(
                        f"{f}: skipped (not JSON/JSONL/YAML; CSV/HTML exports unsupported)"
                    )
                    continue
                if f.resolve() not in seen:
                    seen.add(f.resolve())
                    out.append(f)
        elif p.is_file():
            if p.resolve() not in seen:
                seen.add(p.resolve())
                out.append(p)
        else:
            raise BenchFormatError(f"{p}: no such benchmark result file or folder")
    return out, notes


def _is_side_file(name: str) -> bool:
    patterns = (p for fmt in FORMATS.values() for p in fmt.side_files)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def formats_tried() -> str:
    """Each format and what it needs, for a file that matches none."""
    needs = "; ".join(f"{f.title} {f.files} ({f.needs})" for f in FORMATS.values())
    return f"formats tried and what each needs: {needs.replace('`', '')}"


def detect_kind(doc: Document) -> tuple[BenchFormat, str]:
    """The format of a whole document and its kind (the tool for a result file, else one of its
    companions'); every JSON Lines record must be of one kind."""
    kinds: set[tuple[str, str]] = set()
    for record, line in zip(doc.records, doc.line_numbers, strict=True):
        where = f"{doc.path}: line {line}: " if doc.text_format == "jsonl" else f"{doc.path}: "
        claims = [(f, k) for f in FORMATS.values() if (k := f.detect(doc.path, record)) is not None]
        refined = {tool for f, k in claims if k == f.tool for tool in f.refines}
        claims = [(f, k) for f, k in claims if f.tool not in refined]
        if not claims:
            keys = sorted(str(k) for k in record)[:12] if isinstance(record, dict) else []
            raise BenchFormatError(
                f"{where}unrecognised benchmark result (top-level keys {keys}); {formats_tried()}"
            )
        if len(claims) > 1:
            both = " and ".join(f.title for f, _ in claims)
            raise BenchFormatError(f"{where}the record matches {both}: cannot tell which wrote it")
        kinds.add((claims[0][0].tool, claims[0][1]))
    if len(kinds) > 1:
        raise BenchFormatError(
            f"{doc.path}: JSON Lines mix result formats {sorted(k for _, k in kinds)}"
        )
    tool, kind = kinds.pop()
    return FORMATS[tool], kind


def _json_text(data: Mapping[str, Any]) -> str | None:
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    if not data:
        return None
    return json.dumps(clean(dict(data)), sort_keys=True, default=str)


def _row(path: Path, sha: str, tool: str, raw: RawPoint, manifest: BenchManifest) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(LOAD_POINT_SCHEMA.names())
    row.update(raw.values)
    point_id = f"{tool}:{path}#{raw.record_index}"
    row.update(
        point_id=point_id,
        tool=tool,
        source_file=str(path),
        source_sha256=sha,
        record_index=raw.record_index,
        manifest_file=manifest.source,
        companion_files=_json_text(raw.companion_files),
        engine=manifest.engine,
        engine_version=manifest.engine_version,
        backend=manifest.backend,
        gpu_type=manifest.gpu_type,
        gpu_count=manifest.gpu_count,
        quantization=manifest.quantization,
        price_per_gpu_hour_usd=manifest.price_per_gpu_hour_usd,
        workload=manifest.workload,
    )
    if manifest.model is not None:
        row["model"] = manifest.model
    if row.get("dataset") is None:
        row["dataset"] = manifest.dataset
    if manifest.run_date is not None:
        row["run_date"] = manifest.run_date
    if row.get("tool_version") is None:
        row["tool_version"] = manifest.tool_version
    label = manifest.label
    if label is None and manifest.label_from is not None:
        hint = raw.free_form.get(manifest.label_from, raw.file_metadata.get(manifest.label_from))
        label = None if hint is None else str(hint)
    row["label"] = label if label is not None else raw.file_label
    completed, failed = row.get("completed"), row.get("failed")
    if completed is not None and failed is not None and completed + failed > 0:
        row["error_rate"] = failed / (completed + failed)
    for metric in LATENCY_METRICS:
        for stat in LATENCY_STATS:
            col = f"{metric}_{stat}_ms"
            row[col] = raw.native.get(col)
    if row.get("tpot_definition") is None:
        row["tpot_definition"] = "decode_per_request"
    row["native_stats"] = _json_text(raw.native)
    row["file_metadata"] = _json_text(raw.file_metadata)
    # An empty block is kept ("{}"): it says the deployment overrode no engine argument.
    row["engine_args"] = (
        None if manifest.engine_args is None else json.dumps(manifest.engine_args, sort_keys=True)
    )
    row["recorded_engine_args"] = _json_text(raw.engine_args)
    row["row_notes"] = list(raw.notes)
    row["has_per_request"] = raw.per_request is not None and raw.per_request.height > 0
    return row


def _merge_recomputed(points: pl.DataFrame, per_request: pl.DataFrame | None) -> pl.DataFrame:
    """Replace native stats by recomputed ones family by family; set ``<m>_source`` flags."""
    if per_request is not None and per_request.height:
        stats = recompute_stats(per_request)
        stats = stats.rename({c: f"{c}__re" for c in stats.columns if c != "point_id"})
        frame = points.join(stats, on="point_id", how="left")
    else:
        frame = points
    exprs: list[pl.Expr] = []
    for metric in LATENCY_METRICS:
        cols = [f"{metric}_{stat}_ms" for stat in LATENCY_STATS]
        has_native = pl.any_horizontal([pl.col(c).is_not_null() for c in cols])
        if f"{metric}_n__re" in frame.columns:
            recomputed = pl.col(f"{metric}_n__re").fill_null(0) > 0
            exprs += [
                pl.when(recomputed).then(pl.col(f"{c}__re")).otherwise(pl.col(c)).alias(c)
                for c in cols
            ]
        else:
            recomputed = pl.lit(False)
        exprs.append(
            pl.when(recomputed)
            .then(pl.lit("recomputed"))
            .when(has_native)
            .then(pl.lit("native"))
            .otherwise(pl.lit("missing"))
            .alias(f"{metric}_source")
        )
        if metric == "tpot":
            exprs.append(
                pl.when(recomputed)
                .then(pl.lit("decode_per_request"))
                .when(has_native)
                .then(pl.col("tpot_definition"))
                .otherwise(None)
                .alias("tpot_definition")
            )
    if "input_tokens_mean__re" in frame.columns:
        for side in ("input", "output"):
            for stat in ("mean", "p50", "p99"):
                c = f"{side}_tokens_{stat}"
                exprs.append(pl.coalesce(pl.col(f"{c}__re"), pl.col(c)).alias(c))
            exprs.append(
                pl.coalesce(pl.col(f"{side}_tokens_fixed__re"), pl.col(f"{side}_len_fixed")).alias(
                    f"{side}_len_fixed"
                )
            )
    frame = frame.with_columns(exprs)
    any_recomputed = pl.any_horizontal(
        [pl.col(f"{m}_source") == "recomputed" for m in LATENCY_METRICS]
    )
    return frame.with_columns(
        pl.when(pl.any_horizontal([pl.col(f"itl_{s}_ms").is_not_null() for s in LATENCY_STATS]))
        .then(pl.lit("per_gap_pooled"))
        .otherwise(None)
        .alias("itl_definition"),
        pl.when(any_recomputed)
        .then(pl.lit(METHOD))
        .otherwise(pl.lit("tool"))
        .alias("percentile_method"),
    )


def read_bench_files(
    paths: Sequence[Path | str] | Path | str,
    manifest: ManifestArg = None,
) -> BenchReadResult:
    """Read benchmark result files (or folders of them) into one load-point table.

    ``manifest`` (a mapping, a :class:`BenchManifest`, or a YAML path) is merged over each file's
    sidecar manifest (see :mod:`pipeline.bench.manifest`); engine, GPU type and GPU count are
    required for every result file. Raises :class:`BenchFormatError` for a file that matches no
    known format (naming the formats tried), :class:`BenchFieldError` for an unparseable field
    (naming file, record and field) and
    :class:`~pipeline.bench.manifest.BenchManifestError` for a missing/invalid manifest.
    """
    files, notes = expand_paths(paths)
    if not files:
        where = [paths] if isinstance(paths, (str, Path)) else list(paths)
        raise BenchFormatError(
            f"no benchmark result files found in {', '.join(str(p) for p in where)}"
        )
    rows: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []
    first_with_sha: dict[str, Path] = {}
    for path in files:
        doc = load_document(path, formats_tried())
        fmt, kind = detect_kind(doc)
        if kind != fmt.tool:
            notes.append(f"{path}: {next(c.note for c in fmt.companions if c.kind == kind)}")
            continue
        sha = hashlib.sha256(doc.raw).hexdigest()
        if sha in first_with_sha:
            # A copy under another name is the same run: read twice it would count as a
            # repeat with 0 % noise.
            notes.append(
                f"{path}: byte-identical to {first_with_sha[sha]} (the same run under another "
                "name): read once, not counted as a repeat"
            )
            continue
        first_with_sha[sha] = path
        raw_points = fmt.read(doc)
        man = resolve_manifest(path, manifest)
        for raw in raw_points:
            row = _row(path, sha, fmt.tool, raw, man)
            rows.append(row)
            for note in raw.notes:
                notes.append(f"{row['point_id']}: {note}")
            if raw.per_request is not None and raw.per_request.height:
                frames.append(
                    raw.per_request.with_columns(
                        pl.lit(row["point_id"]).alias("point_id"),
                        pl.lit(str(path)).alias("source_file"),
                        pl.lit(raw.record_index, dtype=pl.Int64).alias("record_index"),
                    )
                )
    per_request = (
        conform_per_request(pl.concat([conform_per_request(f) for f in frames])).sort(
            "point_id", "request_index"
        )
        if frames
        else None
    )
    points = pl.DataFrame(rows, schema=LOAD_POINT_SCHEMA, strict=False, orient="row")
    points = screen_measurements(
        conform_load_points(_merge_recomputed(points, per_request)).sort(
            "source_file", "record_index"
        )
    )
    notes += rejected_notes(points)
    if per_request is not None:
        per_request = per_request.select(PER_REQUEST_SCHEMA.names())
    return BenchReadResult(load_points=points, per_request=per_request, notes=notes)
