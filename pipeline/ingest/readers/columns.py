"""A trace whose columns the configuration names (``format: columns``): a CSV with a header row,
or JSON Lines, as real exports come, mapped field by field by :class:`TraceColumns`.

Never detected (nothing in a file says which column is the arrival); named per trace entry. The
file's first non-blank byte decides: ``{`` is JSON Lines, anything else a CSV whose first
non-blank line is the header. Both forms check every record the way the built-in readers do
(CSV with :class:`CsvReader`'s vectorised checks, JSON Lines with the field validators of
:mod:`pipeline.ingest.readers.base`), so the quarantine reasons are theirs. Only the named
columns are read: a column of prompt text that is not named never leaves the file.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import InputFormatError
from pipeline.ingest.config import COLUMNS_FORMAT, TraceColumns
from pipeline.ingest.readers.base import (
    Chunks,
    JsonLinesReader,
    ReadContext,
    Reader,
    ReadResult,
    RecordError,
    epoch_or_relative,
    first_json_object,
    iso_timestamp,
    number,
    optional_text,
    token_count,
)
from pipeline.ingest.readers.csvtable import Column, CsvReader, Kind
from pipeline.ingest.readers.source import SourceFile, first_nonblank_line

# arrival_unit as written in the configuration → the unit name of base.TIME_UNITS.
_TIME_UNIT = {"s": "s", "ms": "ms", "us": "µs", "ns": "ns"}
# Mapped field → (how its values are read, the canonical column it fills).
_FIELDS: dict[str, tuple[Kind, str]] = {
    "prompt_tokens": ("tokens", "prompt_tokens"),
    "output_tokens": ("tokens", "output_tokens"),
    "session": ("text", "session_id"),
    "turn": ("tokens", "turn"),
    "tenant": ("text", "tenant"),
    "model": ("text", "model"),
    "request_id": ("text", "request_id"),
    "cached_tokens": ("tokens", "cached_tokens"),
    "ttft_ms": ("duration", "ttft_ms"),
    "e2e_ms": ("duration", "e2e_ms"),
}
_REQUIRED = ("arrival", "prompt_tokens")
# Named, these must hold a value in every record (output_tokens may be mapped to null when the
# trace does not log it; mapped to a column, a record without one contradicts the mapping).
_REQUIRED_WHEN_NAMED = ("prompt_tokens", "output_tokens")


def _missing_message(
    source: SourceFile, missing: list[str], mapping: TraceColumns, where: str
) -> str:
    """``missing`` columns, not found in ``where``, with the mapping keys that name them."""
    key_of = {column: key for key, column in mapping.named().items()}  # each column named once
    return (
        f"{source.label}: {where} lacks {', '.join(missing)}, named by "
        f"{', '.join(f'columns.{key_of[name]}' for name in missing)} of this file's entry in "
        "workload.traces: correct the mapping (names are case-sensitive)"
    )


class _MappedCsv(CsvReader):
    """A CSV read with the columns a mapping names (every named column must be in the header)."""

    name = COLUMNS_FORMAT
    description = "CSV with the columns the configuration names"

    def __init__(self, mapping: TraceColumns) -> None:
        self.mapping = mapping
        named = mapping.named()
        arrival_kind: Kind = "datetime" if mapping.arrival_unit == "iso" else "epoch_or_relative"
        arrival = Column(
            named.pop("arrival"),
            arrival_kind,
            "arrival",
            unit=_TIME_UNIT.get(mapping.arrival_unit, "s"),
        )
        # unit: of the durations (ttft_ms, e2e_ms); the other kinds have none
        fields = [
            Column(
                header,
                _FIELDS[key][0],
                _FIELDS[key][1],
                required=key in _REQUIRED_WHEN_NAMED,
                unit="ms",
            )
            for key, header in named.items()
        ]
        # Every named column must be in the header (a typo would otherwise read as all-null).
        self.columns = (arrival, *fields)

    def missing_columns_message(self, source: SourceFile, missing: list[Column]) -> str:
        return _missing_message(source, [c.header for c in missing], self.mapping, "the header")


class _MappedJsonLines(JsonLinesReader):
    """JSON Lines read with the keys a mapping names; a record lacking a required one, or
    holding a value that is not what the field needs, is quarantined naming that key."""

    name = COLUMNS_FORMAT
    description = "JSON Lines with the keys the configuration names"

    def __init__(self, mapping: TraceColumns) -> None:
        self.mapping = mapping

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return True

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        first = first_json_object(source.head())
        named = self.mapping.named()
        if first is not None:
            missing = [named[key] for key in _REQUIRED if _lookup(first, named[key]) is None]
            if missing:
                raise InputFormatError(
                    _missing_message(source, missing, self.mapping, "the first record")
                )
        return super().read(source, ctx)

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        mapping = self.mapping
        row: dict[str, Any] = {
            "arrival": _arrival(obj, mapping, ctx),
            "prefix_hashes": [],
            "prompt_blocks": 0,
            "hashes_known": False,
            "tokens_approximate": False,
        }
        for key, column in mapping.named().items():
            if key == "arrival":
                continue
            kind, target = _FIELDS[key]
            value = _lookup(obj, column)
            if kind == "tokens":
                row[target] = token_count(value, column, allow_none=key not in _REQUIRED_WHEN_NAMED)
            elif kind == "duration":
                row[target] = None if value is None else _non_negative(value, column)
            else:
                row[target] = optional_text(value, column)
        cached, prompt = row.get("cached_tokens"), row.get("prompt_tokens")
        if cached is not None and prompt is not None and cached > prompt:
            raise RecordError(
                mapping.named()["cached_tokens"], "exceeds_prompt_tokens", f"{cached} > {prompt}"
            )
        if row.get("request_id") is None:
            row.pop("request_id", None)  # the reader's own id, file:line
        return row


def _arrival(obj: dict[str, Any], mapping: TraceColumns, ctx: ReadContext) -> Any:
    value = _lookup(obj, mapping.arrival)
    if value is None:
        raise RecordError(mapping.arrival, "missing")
    if mapping.arrival_unit == "iso":
        return iso_timestamp(value, mapping.arrival)
    seconds = number(value, mapping.arrival)
    return epoch_or_relative(seconds, mapping.arrival, ctx.anchor, _TIME_UNIT[mapping.arrival_unit])


def _non_negative(value: Any, key: str) -> float:
    measured = number(value, key)
    if measured < 0:
        raise RecordError(key, "negative", f"value {measured}")
    return measured


def _lookup(obj: dict[str, Any], path: str) -> Any:
    """``obj[path]``, else, for ``a.b``, ``obj["a"]["b"]`` (None when absent)."""
    if path in obj:
        return obj[path]
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return current


class ColumnsReader(Reader):
    """``format: columns``: the trace entry's mapping, read as CSV or JSON Lines by content."""

    name = COLUMNS_FORMAT
    description = "CSV or JSON Lines with the columns the configuration names"

    def __init__(self, mapping: TraceColumns) -> None:
        self.mapping = mapping

    def detect(self, head: bytes) -> bool:
        return False  # never detected: only a trace entry's mapping says what the columns hold

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        return self._form(source).read(source, ctx)

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        return self._form(source).read_chunks(source, ctx, records)

    def _form(self, source: SourceFile) -> Reader:
        first = first_nonblank_line(source.head())
        if not first:
            raise InputFormatError(f"{source.label}: file is empty")
        if first.startswith(b"{"):
            return _MappedJsonLines(self.mapping)
        return _MappedCsv(self.mapping)
