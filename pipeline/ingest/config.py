"""The ingest stage's settings: the ``workload`` section (which traces, how their content is
hashed, the anchor of relative timestamps, daily ingest) and ``ReadConfig`` (how an ad-hoc trace
is read when no workload is configured). Defaults and their documentation:
``pipeline/defaults.yaml``."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, model_validator

from pipeline.hashing import salt_fingerprint
from pipeline.ingest.readers import FORMAT_NAMES
from pipeline.layout import SAFE_NAME
from pipeline.settings import (
    BlockSize,
    ConfigInstant,
    ConfigPath,
    ConfigQuarter,
    Section,
    default_mapping,
)

SALT_ENV_VAR = "ENGINEFIT_HASH_SALT"
# The format of a trace whose columns the configuration names (TraceColumns); never detected.
COLUMNS_FORMAT = "columns"
# With workload.daily_quarter, each trace path names its day with this field (pipeline.ingest.days).
DAY_FIELD = "{day}"


def _known_format(value: Any) -> Any:
    known = ("auto", *FORMAT_NAMES, COLUMNS_FORMAT)
    if isinstance(value, str) and value not in known:
        raise ValueError(f"unknown format {value!r}; choose one of {', '.join(known)}")
    return value


ColumnName = Annotated[str, Field(min_length=1)]
# How the arrival column is written: a number of seconds, milliseconds, microseconds or
# nanoseconds (epoch time, or an offset from workload.anchor when below 10^9 s), or ISO 8601 text.
ArrivalUnit = Literal["s", "ms", "us", "ns", "iso"]
# Optional keys of a column mapping, unset when a trace entry leaves them out.
_OPTIONAL_COLUMNS = (
    "session",
    "turn",
    "tenant",
    "model",
    "request_id",
    "cached_tokens",
    "ttft_ms",
    "e2e_ms",
)


class TraceColumns(Section):
    """Which column (CSV header name) or key (JSON Lines; ``a.b`` reaches into an object) of a
    ``format: columns`` trace holds each canonical field. ``arrival`` and ``prompt_tokens`` are
    required; ``output_tokens`` must be named, or set to null when the trace does not log it.
    Columns not named here are never read, so a prompt-text column stays in the file."""

    arrival: ColumnName
    arrival_unit: ArrivalUnit
    prompt_tokens: ColumnName
    output_tokens: ColumnName | None
    session: ColumnName | None
    turn: ColumnName | None
    tenant: ColumnName | None
    model: ColumnName | None
    request_id: ColumnName | None
    cached_tokens: ColumnName | None
    ttft_ms: ColumnName | None
    e2e_ms: ColumnName | None

    @model_validator(mode="before")
    @classmethod
    def _optional_unset(cls, value: Any) -> Any:
        """Optional keys default to unset; ``arrival_unit`` to seconds."""
        if not isinstance(value, dict):
            return value
        return {"arrival_unit": "s", **dict.fromkeys(_OPTIONAL_COLUMNS), **value}

    @model_validator(mode="after")
    def _each_column_once(self) -> TraceColumns:
        """One column fills one field (a column read twice would be a typo, and the CSV
        reader keys its checks by column name)."""
        seen: dict[str, str] = {}
        for key, column in self.named().items():
            if column in seen:
                raise ValueError(
                    f"column {column!r} is named for both {seen[column]} and {key}: name each "
                    "column once"
                )
            seen[column] = key
        return self

    def named(self) -> dict[str, str]:
        """Each mapped canonical field → its source column, in declaration order."""
        return {
            key: column
            for key, column in self.model_dump().items()
            if key != "arrival_unit" and column is not None
        }


class TraceSource(Section):
    """One trace file (or glob): ``path`` resolved, ``label`` as written (recorded as lineage);
    ``columns`` the column mapping of a ``format: columns`` trace."""

    path: str
    format: Annotated[str, BeforeValidator(_known_format)]
    label: str
    columns: TraceColumns | None

    @model_validator(mode="after")
    def _columns_with_format(self) -> TraceSource:
        if self.format == COLUMNS_FORMAT and self.columns is None:
            raise ValueError(
                "format: columns needs a columns mapping naming the trace's columns, e.g. "
                "columns: {arrival: timestamp, prompt_tokens: prompt_tokens, "
                "output_tokens: completion_tokens}"
            )
        if self.format != COLUMNS_FORMAT and self.columns is not None:
            raise ValueError(
                f"columns is read only with format: columns (this entry has format: {self.format})"
            )
        return self

    @property
    def display(self) -> str:
        return self.label or self.path


def _trace_entries(value: Any, info: ValidationInfo) -> Any:
    """``[path, {path, format}, …]`` → trace entries with the path resolved against the file."""
    if not isinstance(value, list):
        return value
    base = (info.context or {}).get("base")
    entries = []
    for item in value:
        entry = {"path": item} if isinstance(item, str) else item
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            written = Path(entry["path"])
            resolved = written if written.is_absolute() or base is None else Path(base) / written
            entry = {
                "format": "auto",
                "columns": None,
                **entry,
                "path": str(resolved),
                "label": str(written),
            }
        entries.append(entry)
    return tuple(entries)


def _slug(value: Any) -> Any:
    if isinstance(value, str) and not SAFE_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a workload name: use letters, digits, '.', '_' and '-' "
            "(it names the output folder, so no '/' or '..')"
        )
    return value


class IngestConfig(Section):
    """The ``workload`` section: which traces, how their content is hashed, the anchor of
    relative timestamps, daily ingest."""

    name: Annotated[str, BeforeValidator(_slug)]
    traces: Annotated[tuple[TraceSource, ...], BeforeValidator(_trace_entries), Field(min_length=1)]
    block_size: BlockSize
    # Optional: only traces whose content (or block ids) is stored as hashes need one, and
    # ingest says so naming this key when such a trace meets no salt.
    hash_salt: Annotated[str, Field(min_length=1)] | None
    anchor: ConfigInstant
    tokenizer: ConfigPath | None
    # Ingest this quarter day by day (Dagster daily partitions, pipeline.ingest.days); None:
    # every trace file at once.
    daily_quarter: ConfigQuarter | None

    @model_validator(mode="after")
    def _days_named(self) -> IngestConfig:
        """Daily ingest reads each day's files, so every path names its day, and only then:
        a path without it would be read again by every day, one with it matches no file."""
        daily = self.daily_quarter is not None
        wrong = [t for t in self.traces if (DAY_FIELD in t.path) != daily]
        if wrong and daily:
            raise ValueError(
                f"traces: {wrong[0].display} has no {DAY_FIELD}: with workload.daily_quarter "
                f"every trace path names its day, e.g. traces/requests-{DAY_FIELD}.jsonl"
            )
        if wrong:
            raise ValueError(
                f"traces: {wrong[0].display} names {DAY_FIELD}, which only daily ingest fills: "
                "set workload.daily_quarter (YYYY-Qn) or name the files without it"
            )
        return self

    @property
    def salt_bytes(self) -> bytes:
        """The salt, or ``b""`` when none is configured."""
        return self.hash_salt.encode() if self.hash_salt else b""

    @property
    def salt_fingerprint(self) -> str | None:
        """A short tag of the salt that is slow to confirm a guess against (None: no salt)."""
        return salt_fingerprint(self.salt_bytes) if self.hash_salt else None


class ReadConfig(Section):
    """How trace files are read: the workload's settings, or the defaults when there is none."""

    block_size: BlockSize
    anchor: ConfigInstant
    tokenizer: ConfigPath | None


@cache
def documented_anchor() -> datetime:
    """The anchor ``pipeline/defaults.yaml`` documents: what a workload that names none gets."""
    workload = default_mapping()["workload"]
    read = {key: workload.get(key) for key in ReadConfig.model_fields}
    return ReadConfig.model_validate(read, context={"base": None}).anchor
