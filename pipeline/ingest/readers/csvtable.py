"""Comma-separated traces, parsed column-wise with polars so a million rows take about a second.

A CSV reader declares its required header names and how each maps to a canonical column
(:class:`Column`). Lines keep their 1-based numbers (the header is line 1), blank lines are not
records, quoted lines go through the ``csv`` module, and a row that fails any column is
quarantined with the first failing field and the reason.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipeline.errors import InputFormatError
from pipeline.ingest.readers.base import (
    EARLIEST_ARRIVAL,
    EPOCH_SECONDS_MIN,
    LATEST_ARRIVAL,
    TIME_UNITS,
    Chunks,
    ReadContext,
    Reader,
    ReadResult,
    rest_of_read,
    whole,
)
from pipeline.ingest.readers.source import SourceFile, first_nonblank_line
from pipeline.schema import MAX_PLAUSIBLE_TOKENS, QUARANTINE_SCHEMA, conform, empty_quarantine

# epoch_or_relative: a number of ``unit`` (epoch time when at least EPOCH_SECONDS_MIN seconds,
# else an offset from the anchor); duration: a number of ``unit``, stored in ms; datetime: text.
Kind = Literal["tokens", "text", "epoch_or_relative", "datetime", "duration"]

_DATETIME_FORMATS = ("%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S")
# ISO 8601 with a zone (``Z`` or ``+02:00``), tried on what the naive formats leave unparsed.
_ZONED_DATETIME_FORMATS = ("%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z")
# The body's non-blank lines with their 1-based numbers, before they are split into fields.
_LINES = {"line": pl.Int64, "raw": pl.String}


@dataclass(frozen=True)
class Column:
    """A source column: its header name, how to parse it, and the canonical column it fills."""

    header: str
    kind: Kind
    target: str
    required: bool = True  # an empty required value quarantines the row; an optional one is null
    unit: str = "s"  # of an epoch_or_relative or duration column: one of TIME_UNITS

    @property
    def seconds_per_unit(self) -> float:
        return 1000.0 ** -TIME_UNITS.index(self.unit)


def parse_header(line: bytes) -> list[str]:
    text = line.decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r")
    return [name.strip() for name in _csv_fields(text)]


def _csv_fields(text: str) -> list[str]:
    """One line's fields; a line the csv module rejects (e.g. a bare CR inside) has none."""
    try:
        return next(csv.reader([text]), [])
    except csv.Error:
        return []


class CsvReader(Reader):
    columns: tuple[Column, ...]
    optional_columns: tuple[Column, ...] = ()
    # Other spellings of a header seen in releases of the same data set -> the one used here.
    header_aliases: dict[str, str] = {}  # noqa: RUF012 - read-only class data

    def _header(self, line: bytes) -> list[str]:
        return [self.header_aliases.get(name, name) for name in parse_header(line)]

    def detect(self, head: bytes) -> bool:
        names = set(self._header(first_nonblank_line(head)))
        return {c.header for c in self.columns} <= names

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        return whole(self.read_chunks(source, ctx, None))

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        """:meth:`read`'s rows, yielded every ``records`` records (None: once), the file's
        lines read a block at a time (:meth:`SourceFile.iter_line_blocks`)."""
        blocks = source.iter_line_blocks(ctx.progress)
        header_bytes, body, first_line = _header_and_body(blocks)
        header = self._header(header_bytes)
        missing = [c for c in self.columns if c.header not in header]
        if missing:  # only when the format was forced: detection requires these columns
            raise InputFormatError(self.missing_columns_message(source, missing))
        present = [c for c in (*self.columns, *self.optional_columns) if c.header in header]
        quarantines: list[pl.DataFrame] = []
        pending: list[pl.DataFrame] = []  # lines not yet made rows
        read = kept = waiting = 0
        for block in itertools.chain([body], (block for block, _ in blocks)):
            if not block:
                continue
            lines, unreadable = _split_lines(block, source.label, first_line)
            first_line += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
            quarantines.append(unreadable)
            read += unreadable.height
            pending.append(lines)
            waiting += lines.height
            while records is not None and waiting >= records:
                ready = pl.concat(pending)
                requests, bad = self._rows(ready.head(records), header, present, source, ctx)
                pending, waiting = [ready.slice(records)], waiting - records
                quarantines.append(bad)
                read, kept = read + records, kept + requests.height
                yield requests
        if waiting or records is None:
            ready = pl.concat([pl.DataFrame(schema=_LINES), *pending])
            requests, bad = self._rows(ready, header, present, source, ctx)
            quarantines.append(bad)
            read, kept = read + ready.height, kept + requests.height
            yield requests
        quarantined = pl.concat([empty_quarantine(), *quarantines]).sort("source_line")
        notes = () if read else (f"{source.label}: the file has a header and no records",)
        return rest_of_read(read, kept, quarantined, notes=notes)

    def _rows(
        self,
        lines: pl.DataFrame,
        header: list[str],
        present: list[Column],
        source: SourceFile,
        ctx: ReadContext,
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Non-blank body lines (``line``, ``raw``) as canonical rows, and the quarantine of
        those that are not records."""
        fields = _split_fields(lines, len(header))
        complete = pl.col("n_fields") == len(header)
        records = fields if fields.select(complete.all()).item() else fields.filter(complete)
        wrong = fields.filter(pl.col("n_fields") != len(header)).select(
            pl.lit(source.label).alias("source_file"),
            pl.col("line").alias("source_line"),
            pl.lit("<line>").alias("field"),
            pl.lit("wrong_field_count").alias("reason"),
            pl.format("{} fields, header has {}", "n_fields", pl.lit(len(header))).alias("detail"),
        )
        strings = records.select(
            "line",
            *[
                pl.col("fields").list.get(header.index(c.header)).str.strip_chars().alias(c.header)
                for c in present
            ],
        )
        # Each value is parsed once into _value_<header>; the checks read those columns.
        parsed = strings.with_columns(
            _parse_column(strings[c.header], c, ctx).alias(_value(c)) for c in present
        ).with_columns(_error_exprs(present))
        bad = parsed.filter(pl.col("_error_field").is_not_null()).select(
            pl.lit(source.label).alias("source_file"),
            pl.col("line").alias("source_line"),
            pl.col("_error_field").alias("field"),
            pl.col("_error_reason").alias("reason"),
            pl.lit("").alias("detail"),
        )
        good = parsed.filter(pl.col("_error_field").is_null()) if bad.height else parsed
        line_id = pl.format("{}:{}", pl.lit(source.label), "line")
        logged_id = next((c for c in present if c.target == "request_id"), None)
        requests = conform(
            good.select(
                *[pl.col(_value(c)).alias(c.target) for c in present if c is not logged_id],
                (
                    line_id
                    if logged_id is None
                    else pl.coalesce(pl.col(_value(logged_id)), line_id)
                ).alias("request_id"),
                pl.lit(self.name).alias("source_format"),
                pl.lit(source.label).alias("source_file"),
                pl.col("line").alias("source_line"),
                pl.lit(ctx.block_size).alias("block_size"),
                pl.lit([], dtype=pl.List(pl.UInt64)).alias("prefix_hashes"),
                pl.lit(0).alias("prompt_blocks"),
                pl.lit(False).alias("hashes_known"),
                pl.lit(False).alias("tokens_approximate"),
            )
        )
        return requests, pl.concat([wrong.cast(QUARANTINE_SCHEMA), bad.cast(QUARANTINE_SCHEMA)])

    def missing_columns_message(self, source: SourceFile, missing: list[Column]) -> str:
        headers = ", ".join(c.header for c in missing)
        return f"{source.label}: not a {self.name} file; header lacks {headers}"

    @property
    def needs(self) -> str:
        return f"CSV, header with {', '.join(c.header for c in self.columns)}"


def _header_and_body(blocks: Iterator[tuple[bytes, bool]]) -> tuple[bytes, bytes, int]:
    """From blocks of whole lines: the header (the first line that is not blank; blank lines
    before it are not records), the rest of its block and the number of that rest's first
    line. Later blocks are left in ``blocks``."""
    line = 1
    for block, _ in blocks:
        stripped = block.lstrip(b"\r\n \t")
        line += block[: len(block) - len(stripped)].count(b"\n")
        if stripped:
            end = stripped.find(b"\n")
            if end < 0:
                return stripped, b"", line + 1
            return stripped[:end], stripped[end + 1 :], line + 1
    return b"", b"", line + 1


def _split_lines(body: bytes, label: str, first_line: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Body lines as text with their line numbers; lines that are not UTF-8 are quarantined."""
    fast = _lines_by_polars(body)
    if fast is not None:
        texts: pl.Series | list[str | None] = fast
        bad_lines: list[int] = []
    else:
        texts, bad_lines = _lines_by_python(body, first_line)
    lines = pl.DataFrame(
        {"line": pl.int_range(first_line, first_line + len(texts), eager=True), "raw": texts},
        schema=_LINES,
    ).filter(pl.col("raw").is_not_null() & (pl.col("raw").str.strip_chars() != ""))
    quarantine = pl.DataFrame(
        {
            "source_file": [label] * len(bad_lines),
            "source_line": bad_lines,
            "field": ["<line>"] * len(bad_lines),
            "reason": ["invalid_utf8"] * len(bad_lines),
            "detail": [""] * len(bad_lines),
        },
        schema=QUARANTINE_SCHEMA,
    )
    return lines, quarantine


def _lines_by_polars(body: bytes) -> pl.Series | None:
    """Every line via polars' reader (ten times faster than Python), or None when it would skip
    or merge lines: it drops blank lines and rejects invalid UTF-8, and line numbers must hold."""
    if not body or b"\x1f" in body:
        return None
    expected = body.count(b"\n") + (0 if body.endswith(b"\n") else 1)
    try:
        frame = pl.read_csv(
            body,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["raw"],
            infer_schema=False,
        )
    except Exception:  # noqa: BLE001 - any refusal just means "use the exact Python path"
        return None
    if frame.height != expected or frame.width != 1:
        return None
    return frame["raw"].fill_null("")


def _lines_by_python(body: bytes, first_line: int) -> tuple[list[str | None], list[int]]:
    raw_lines = body.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    try:
        return list(body.decode("utf-8").split("\n")[: len(raw_lines)]), []
    except UnicodeDecodeError:
        pass
    texts: list[str | None] = []
    bad_lines: list[int] = []
    for number, raw in enumerate(raw_lines, start=first_line):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
            bad_lines.append(number)
    return texts, bad_lines


def _split_fields(lines: pl.DataFrame, width: int) -> pl.DataFrame:
    """Split on commas; lines with quotes go through the csv module to honour quoting."""
    quoted = pl.col("raw").str.contains('"', literal=True)
    plain = lines.filter(~quoted).select(
        "line", pl.col("raw").str.strip_chars_end("\r").str.split(",").alias("fields")
    )
    quoted_rows = lines.filter(quoted)
    parsed = [_csv_fields(text.rstrip("\r")) for text in quoted_rows["raw"].to_list()]
    quoted_frame = pl.DataFrame(
        {"line": quoted_rows["line"], "fields": parsed},
        schema={"line": pl.Int64, "fields": pl.List(pl.String)},
    )
    return (
        pl.concat([plain, quoted_frame])
        .sort("line")
        .with_columns(pl.col("fields").list.len().alias("n_fields"))
    )


def _value(column: Column) -> str:
    return f"_value_{column.header}"


def _parse_datetimes(raw: pl.Series) -> pl.Series:
    """Naive wall-clock strings as UTC, zoned ISO 8601 converted to UTC; later formats are
    tried only on rows earlier ones missed."""
    utc = pl.Datetime("us", "UTC")
    parsed = raw.str.strptime(pl.Datetime("us"), _DATETIME_FORMATS[0], strict=False)
    parsed = parsed.dt.replace_time_zone("UTC")
    attempts = [(fmt, False) for fmt in _DATETIME_FORMATS[1:]]
    for fmt, zoned in [*attempts, *((fmt, True) for fmt in _ZONED_DATETIME_FORMATS)]:
        missing = parsed.is_null() & raw.is_not_null()
        if not missing.any():
            break
        if zoned:
            retry = raw.str.strptime(utc, fmt, strict=False)
        else:
            retry = raw.str.strptime(pl.Datetime("us"), fmt, strict=False)
            retry = retry.dt.replace_time_zone("UTC")
        parsed = pl.select(pl.when(missing).then(retry).otherwise(parsed)).to_series()
    return parsed


def _parse_column(raw: pl.Series, column: Column, ctx: ReadContext) -> pl.Series:
    if column.kind == "datetime":
        return _parse_datetimes(raw)
    frame = raw.to_frame("raw")
    if column.kind == "tokens":
        expr = pl.col("raw").cast(pl.Int64, strict=False)
    elif column.kind == "duration":  # stored in ms
        expr = pl.col("raw").cast(pl.Float64, strict=False) * (column.seconds_per_unit * 1000.0)
    elif column.kind == "epoch_or_relative":
        seconds = pl.col("raw").cast(pl.Float64, strict=False) * column.seconds_per_unit
        finite = pl.when(seconds.is_finite() & (seconds < 1e11)).then(seconds)
        micros = (finite * 1e6).round().cast(pl.Int64)
        epoch = pl.from_epoch(micros, time_unit="us").dt.replace_time_zone("UTC")
        relative = pl.lit(ctx.anchor).dt.cast_time_unit("us") + pl.duration(microseconds=micros)
        expr = pl.when(finite >= EPOCH_SECONDS_MIN).then(epoch).otherwise(relative)
    else:
        expr = pl.when(pl.col("raw") == "").then(None).otherwise(pl.col("raw"))
    return frame.select(expr).to_series()


def _error_exprs(columns: list[Column]) -> list[pl.Expr]:
    """``_error_field`` / ``_error_reason`` of each row's first failing column (null when clean)."""
    checks: list[tuple[str, str, pl.Expr]] = []
    for column in columns:
        raw, value = pl.col(column.header), pl.col(_value(column))
        empty = raw.is_null() | (raw == "")
        if column.kind == "text":
            continue
        if column.required:
            checks.append((column.header, "missing", empty))
        if column.kind == "tokens":
            checks += [
                (column.header, "not_an_integer", ~empty & value.is_null()),
                (column.header, "negative", value < 0),
                (column.header, "absurd_value", value > MAX_PLAUSIBLE_TOKENS),
            ]
        elif column.kind in ("epoch_or_relative", "duration"):
            number = raw.cast(pl.Float64, strict=False)
            checks += [
                (column.header, "not_a_number", ~empty & (number.is_null() | number.is_nan())),
                (column.header, "not_finite", number.is_infinite()),
                (column.header, "negative", number < 0),
            ]
            if column.kind == "epoch_or_relative":
                seconds = number * column.seconds_per_unit
                checks.append((column.header, "timestamp_unit_mismatch", seconds >= 1e11))
        if column.kind in ("epoch_or_relative", "datetime"):
            if column.kind == "datetime":
                checks.append((column.header, "not_a_timestamp", ~empty & value.is_null()))
            checks.append(
                (
                    column.header,
                    "implausible_timestamp",
                    (value < EARLIEST_ARRIVAL) | (value >= LATEST_ARRIVAL),
                )
            )
    # Counts that contradict each other: more provider-cached prompt tokens than prompt tokens.
    by_target = {column.target: column for column in columns}
    cached, prompt = by_target.get("cached_tokens"), by_target.get("prompt_tokens")
    if cached is not None and prompt is not None:
        checks.append(
            (
                cached.header,
                "exceeds_prompt_tokens",
                pl.col(_value(cached)) > pl.col(_value(prompt)),
            )
        )
    field_expr: pl.Expr = pl.lit(None, dtype=pl.String)
    reason_expr: pl.Expr = pl.lit(None, dtype=pl.String)
    for name, reason, failed in reversed(checks):  # first failing check wins
        hit = failed.fill_null(False)
        field_expr = pl.when(hit).then(pl.lit(name)).otherwise(field_expr)
        reason_expr = pl.when(hit).then(pl.lit(reason)).otherwise(reason_expr)
    return [field_expr.alias("_error_field"), reason_expr.alias("_error_reason")]
