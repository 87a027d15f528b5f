"""Shared helpers for the benchmark readers: what a reader declares (:class:`BenchFormat`), strict
field access and the raw point record."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.bench.detect import BenchFormatError, Document
from pipeline.bench.manifest import ENGINE_ARG_TYPES
from pipeline.bench.schema import PER_REQUEST_SCHEMA
from pipeline.errors import InputFormatError, os_reason
from pipeline.safe_read import read_regular

# normalised stat name -> the spellings tools use for it
STAT_ALIASES: dict[str, tuple[str, ...]] = {
    "mean": ("mean", "avg"),
    "p50": ("p50", "median"),
    "p90": ("p90",),
    "p95": ("p95",),
    "p99": ("p99",),
    "max": ("max",),
}
_NUMERIC_STRING = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_INF_STRINGS = {"inf", "+inf", "infinity", "+infinity"}
MAX_INT = 2**63  # counts are stored as Int64


class BenchFieldError(BenchFormatError):
    """A field of a recognised benchmark file holds a value that cannot be used."""

    def __init__(self, file: Path | str, record: str, field_name: str, problem: str) -> None:
        super().__init__(f"{file}: {record}: field '{field_name}': {problem}")
        self.file = str(file)
        self.record = record
        self.field = field_name


@dataclass
class Ctx:
    """Where a reader is: for error messages."""

    path: Path
    record: str  # e.g. "line 3", "benchmarks[1]", "stage 4"

    def fail(self, field_name: str, problem: str) -> BenchFieldError:
        return BenchFieldError(self.path, self.record, field_name, problem)

    def num(self, obj: Mapping[str, Any], key: str, *, label: str | None = None) -> float | None:
        """A number (int/float/numeric string/'inf'); None when absent or null; else an error."""
        if key not in obj:
            return None
        return self.as_num(obj[key], label or key)

    def as_num(self, value: Any, label: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool):
            raise self.fail(label, f"expected a number, got boolean {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            text = value.strip().replace(",", "") if "," in value else value.strip()
            if text.lower() in _INF_STRINGS:
                return math.inf
            if _NUMERIC_STRING.match(text):
                return float(text)
            raise self.fail(label, f"expected a number, got string {value!r}")
        raise self.fail(label, f"expected a number, got {type(value).__name__}")

    def int_(self, obj: Mapping[str, Any], key: str, *, label: str | None = None) -> int | None:
        v = self.num(obj, key, label=label)
        return self.to_int(v, label or key)

    def to_int(self, v: float | None, label: str) -> int | None:
        if v is None:
            return None
        if not math.isfinite(v) or v != int(v):
            raise self.fail(label, f"expected a whole number, got {v!r}")
        if not -MAX_INT < v < MAX_INT:
            raise self.fail(label, f"{v:.6g} is out of range for a count")
        return int(v)

    def rounded(self, v: float | None, label: str) -> int | None:
        """A count the tool wrote as a float (token totals, mean × count), to the nearest whole
        number; a non-finite or out-of-range value is an error naming the field."""
        if v is None:
            return None
        if not math.isfinite(v):
            raise self.fail(label, f"expected a finite count, got {v!r}")
        return self.to_int(float(round(v)), label)

    def str_(self, obj: Mapping[str, Any], key: str) -> str | None:
        if key not in obj or obj[key] is None:
            return None
        v = obj[key]
        if isinstance(v, (dict, list)):
            raise self.fail(key, f"expected text, got {type(v).__name__}")
        return str(v)

    def dict_(self, obj: Mapping[str, Any], key: str) -> dict[str, Any]:
        """A nested object; {} when absent or null."""
        v = obj.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.fail(key, f"expected an object, got {type(v).__name__}")
        return v

    def num_list(self, obj: Mapping[str, Any], key: str) -> list[float | None] | None:
        if key not in obj or obj[key] is None:
            return None
        v = obj[key]
        if not isinstance(v, list):
            raise self.fail(key, f"expected a list, got {type(v).__name__}")
        return [self.as_num(x, f"{key}[{i}]") for i, x in enumerate(v)]

    def nested_num_list(self, obj: Mapping[str, Any], key: str) -> list[list[float]] | None:
        if key not in obj or obj[key] is None:
            return None
        v = obj[key]
        if not isinstance(v, list):
            raise self.fail(key, f"expected a list of lists, got {type(v).__name__}")
        for i, inner in enumerate(v):
            if not isinstance(inner, list):
                raise self.fail(f"{key}[{i}]", f"expected a list, got {type(inner).__name__}")
        # fast path: every element already an int/float (type check runs in C via map/set)
        if set(map(type, itertools.chain.from_iterable(v))) <= {float, int}:
            return v
        out: list[list[float]] = []
        for i, inner in enumerate(v):
            row: list[float] = []
            for j, x in enumerate(inner):
                n = self.as_num(x, f"{key}[{i}][{j}]")
                if n is None:
                    raise self.fail(f"{key}[{i}][{j}]", "expected a number, got null")
                row.append(n)
            out.append(row)
        return out

    def stats_block(
        self, block: Mapping[str, Any], label: str, scale: float, prefix: str
    ) -> dict[str, float | None]:
        """``{<prefix>_<stat>: value × scale}`` for mean/p50/p90/p95/p99/max found in ``block``."""
        out: dict[str, float | None] = {}
        for stat, aliases in STAT_ALIASES.items():
            for alias in aliases:
                if alias in block:
                    v = self.as_num(block[alias], f"{label}.{alias}")
                    out[f"{prefix}_{stat}"] = None if v is None else v * scale
                    break
        return out


@dataclass
class RawPoint:
    """One load point as a reader sees it, before manifest, recomputation and conforming.

    ``values`` holds LOAD_POINT_SCHEMA columns (any subset). ``native`` holds the tool's own
    aggregates under normalised names (``ttft_p99_ms`` …); the latency families are filled from it
    unless ``per_request`` has the data. ``per_request`` has PER_REQUEST_SCHEMA columns except
    the lineage ones.
    """

    record_index: int
    values: dict[str, Any] = field(default_factory=dict)
    native: dict[str, float | None] = field(default_factory=dict)
    per_request: pl.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    file_metadata: dict[str, Any] = field(default_factory=dict)
    file_label: str | None = None
    #: every key a user may add to the file (vLLM ``--metadata`` …), in memory only: the
    #: manifest's ``label_from`` reads it; only allowlisted keys reach ``file_metadata``
    free_form: dict[str, Any] = field(default_factory=dict)
    #: engine arguments the file itself records (SGLang ``server_info``, vLLM ``--metadata``
    #: keys named as the manifest's ``engine_args``), by the manifest's names
    engine_args: dict[str, Any] = field(default_factory=dict)
    #: files the reader opened beside the result file (path -> sha256 of the bytes read), so
    #: a report records them among its inputs and its audit checks them
    companion_files: dict[str, str] = field(default_factory=dict)

    def read_companion(self, path: Path, what: str) -> str:
        """The text of ``path``, a file read with this point's result file (``what`` names it
        in errors), recorded in :attr:`companion_files`."""
        try:
            data = read_regular(path)
            text = data.decode("utf-8")
        except OSError as exc:
            raise BenchFormatError(f"{path}: cannot read {what}: {os_reason(exc)}") from exc
        except (InputFormatError, UnicodeDecodeError) as exc:
            raise BenchFormatError(f"{path}: cannot read {what}: {exc}") from exc
        self.companion_files[str(path)] = hashlib.sha256(data).hexdigest()
        return text


#: The longest text value kept from a free-form key (a hint such as ``4xNVIDIA_L40S``).
MAX_HINT_CHARS = 200
_KEY_NAME = re.compile(r"^[\w.:-]{1,64}$")


def is_short_hint(value: Any) -> bool:
    """A number, or one line of at most :data:`MAX_HINT_CHARS` characters (not a prompt)."""
    if isinstance(value, (int, float, bool)):
        return True
    return isinstance(value, str) and len(value) <= MAX_HINT_CHARS and "\n" not in value


def keep_free_form(point: RawPoint, free_form: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Keys a tool lets its user add (vLLM ``--metadata``, llmperf metadata, anything new):
    kept in memory for the manifest's ``label_from``, persisted in ``file_metadata`` only when
    the tool's allowlist names them and the value is a short scalar, because a result file may
    carry prompts. The others are counted in a note (named when they look like key names)."""
    point.free_form = {str(k): v for k, v in free_form.items()}
    dropped: list[str] = []
    for key, value in point.free_form.items():
        if key in allowed and is_short_hint(value):
            point.file_metadata[key] = value
        else:
            dropped.append(key)
    if dropped:
        names = sorted(k for k in dropped if _KEY_NAME.match(k))
        listed = f": {', '.join(names[:10])}{' …' if len(names) > 10 else ''}" if names else ""
        point.notes.append(
            f"{len(dropped)} free-form key(s) not kept (not on the reader's allowlist, or not a "
            f"short value; a result file may carry prompts){listed}"
        )


def epoch_to_utc(ctx: Ctx, seconds: float | None, label: str) -> dt.datetime | None:
    """Epoch seconds as an aware UTC time; a time no calendar holds is an error naming it."""
    if seconds is None or not math.isfinite(seconds):
        return None
    try:
        return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ctx.fail(label, f"epoch time {seconds!r} is out of range") from exc


def parse_iso(ctx: Ctx, value: Any, label: str) -> dt.datetime | None:
    """ISO-8601 text to an aware UTC datetime (naive taken as UTC)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ctx.fail(label, f"expected an ISO-8601 time, got {type(value).__name__}")
    try:
        t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ctx.fail(label, f"expected an ISO-8601 time, got {value!r}") from exc
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def first_str(values: Sequence[Any] | Any) -> str | None:
    """First element of a list (or the value itself) as text."""
    if isinstance(values, list):
        return str(values[0]) if values else None
    return None if values is None else str(values)


def companion_path(summary: Path, suffix: str, extension: str, default: str) -> Path:
    """The per-request file written beside a summary: ``<stem><suffix>`` → ``<stem><extension>``,
    else the tool's default name in the same folder."""
    if summary.name.endswith(suffix):
        return summary.with_name(summary.name[: -len(suffix)] + extension)
    return summary.with_name(default)


def per_request_frame(columns: Mapping[str, Sequence[Any] | None], n: int) -> pl.DataFrame:
    """A per-request frame from equal-length columns (None columns become nulls)."""
    data: dict[str, Any] = {"request_index": list(range(n))}
    schema: dict[str, pl.DataType] = {"request_index": pl.Int64()}
    # The per-request measures are the schema's columns after the lineage ones.
    dtypes = {
        name: dtype
        for name, dtype in PER_REQUEST_SCHEMA.items()
        if name not in ("point_id", "source_file", "record_index", "request_index")
    }
    for name, dtype in dtypes.items():
        col = columns.get(name)
        data[name] = list(col) if col is not None else [None] * n
        schema[name] = dtype
    return pl.DataFrame(data, schema=schema, strict=False)


def with_tpot(frame: pl.DataFrame) -> pl.DataFrame:
    """Per-request TPOT = (e2e − ttft)/(out − 1) for ok requests with > 1 output token.

    When e2e is unknown, ``sum(itl)`` stands for ``e2e − ttft`` (vLLM/SGLang clients measure the
    gaps from the first token to the last, so the two are equal)."""
    decode = (
        pl.when(pl.col("e2e_ms").is_not_null())
        .then(pl.col("e2e_ms") - pl.col("ttft_ms"))
        .otherwise(pl.col("itl_ms").list.sum())
    )
    return frame.with_columns(
        pl.when(pl.col("ok") & (pl.col("output_tokens") > 1) & pl.col("ttft_ms").is_not_null())
        .then(decode / (pl.col("output_tokens") - 1).cast(pl.Float64))
        .otherwise(None)
        .alias("tpot_ms")
    )


@dataclass(frozen=True)
class Companion:
    """A file a tool writes beside its results that is not a load point by itself."""

    kind: str  # what the format's ``detect`` returns for it
    rule: str  # how it is told apart (docs/bench.md)
    note: str  # the note when it is met on its own


@dataclass(frozen=True)
class BenchFormat:
    """What one tool's reader module declares as ``FORMAT``; :mod:`pipeline.bench.readers`
    collects every module's, so a new tool is one module (with its sample and docs section).

    ``detect`` sees each parsed record and its file's path and returns ``tool`` for a result,
    a companion's kind, or None. A record two formats claim is an error unless one ``refines``
    the other (its results are a narrower case of the other's rule, e.g. SGLang of vLLM).
    ``side_files`` are name patterns of files the tool writes that are neither results nor
    companions, skipped with a note when a folder is expanded.
    """

    tool: str  # the ``tool`` column
    title: str  # its section under docs/bench.md#result-formats-read
    files: str  # the result files, as a user knows them
    needs: str  # what a record needs to be read as this tool's result
    detect: Callable[[Path, Any], str | None]
    read: Callable[[Document], list[RawPoint]]
    companions: tuple[Companion, ...] = ()
    refines: tuple[str, ...] = ()
    side_files: tuple[str, ...] = ()


def first_object(record: Any) -> dict[str, Any] | None:
    """The first element of a non-empty list of objects (a per-request or sweep listing)."""
    if isinstance(record, list) and record and all(isinstance(x, dict) for x in record):
        first: dict[str, Any] = record[0]
        return first
    return None


def read_records(
    doc: Document, read_record: Callable[[Ctx, Mapping[str, Any], int], RawPoint]
) -> list[RawPoint]:
    """One point per record: a JSON Lines file holds one run per line."""
    lines = zip(doc.records, doc.line_numbers, strict=True)
    return [
        read_record(Ctx(doc.path, f"line {n}" if doc.text_format == "jsonl" else "record 0"), r, i)
        for i, (r, n) in enumerate(lines)
    ]


def whole_document(
    read: Callable[[Ctx, Mapping[str, Any]], RawPoint],
) -> Callable[[Document], list[RawPoint]]:
    """A reader of one point per file (its first record) as a :attr:`BenchFormat.read`."""
    return lambda doc: [read(Ctx(doc.path, "document"), doc.records[0])]


def truncate_error(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    if not text:
        return None
    return text[:200]


KIND_WORDS = {int: "a whole number ≥ 1", float: "a number", bool: "true or false", str: "a name"}


def record_engine_args(
    point: RawPoint, values: Mapping[str, Any], names: Mapping[str, str]
) -> None:
    """Engine arguments the file records (``names``: the file's key → the manifest's
    ``engine_args`` name), kept in :attr:`RawPoint.engine_args` as their declared types; a value
    that is not one (``"lots"`` for a token budget) is left out with a note. Texts are read as
    numbers or booleans (vLLM ``--metadata`` values are text)."""
    for key, name in names.items():
        if key not in values or values[key] is None:
            continue
        value, kind = values[key], ENGINE_ARG_TYPES[name]
        parsed: Any = None
        if kind is bool:
            text = str(value).strip().lower()
            parsed = value if isinstance(value, bool) else {"true": True, "false": False}.get(text)
        elif kind is int and not isinstance(value, bool):
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            parsed = int(number) if number.is_integer() and number >= 1 else None
        elif kind is float and not isinstance(value, bool):
            try:
                parsed = float(value)
            except (TypeError, ValueError):
                parsed = None
        elif kind is str and isinstance(value, str) and value.strip():
            parsed = value.strip().lower()
        if parsed is None:
            point.notes.append(
                f"engine argument {key}={value!r} in the file is not {KIND_WORDS[kind]}: left out"
            )
        else:
            point.engine_args[name] = parsed
