"""What every reader shares: the context it reads with, per-record validation, quarantine.

A reader turns one source file into canonical rows plus quarantined records, and counts every
record it read, so ``records_read == ingested + quarantined`` holds per file. A record that
cannot be used raises :class:`RecordError` naming the field and the reason; the line-oriented
machinery here turns that into a quarantine row. Nothing a record contains is echoed into a
quarantine detail except numbers, so no prompt text can leak there.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.hashing import chain_hash_tokens
from pipeline.ingest.readers.source import SourceFile
from pipeline.ingest.tokenize import ApproximateTokenizer, Tokenizer
from pipeline.schema import (
    CANONICAL_SCHEMA,
    MAX_PLAUSIBLE_TOKENS,
    QUARANTINE_SCHEMA,
    empty_canonical,
    empty_quarantine,
)

# Epoch timestamps before this are taken as relative to the anchor (2001-09-09 in seconds).
EPOCH_SECONDS_MIN = 1e9
# Plausible absolute arrival years; anything outside is a unit or parsing error.
EARLIEST_ARRIVAL = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_ARRIVAL = datetime(2100, 1, 1, tzinfo=UTC)
# Library default only; the pipeline always passes the configured workload.anchor.
DEFAULT_ANCHOR = EARLIEST_ARRIVAL


@dataclass(frozen=True)
class ReadContext:
    """Settings every reader needs: block size, hash salt, anchor date, tokenizer."""

    block_size: int = 16
    salt: bytes = b"enginefit"
    anchor: datetime = DEFAULT_ANCHOR
    tokenizer: Tokenizer = field(default_factory=ApproximateTokenizer)
    progress: Callable[[int], None] | None = None


class RecordError(Exception):
    """One record is unusable: which field, a short reason code, and a content-free detail."""

    def __init__(self, field_name: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{field_name}: {reason} {detail}".strip())
        self.field = field_name
        self.reason = reason
        self.detail = detail


@dataclass
class ReadResult:
    """One file read: its rows, its quarantine, and how many records it held.

    ``prompt_blocks_capped`` counts rows whose hashed prompt had more full blocks than the
    authoritative prompt token count allows (their ``prompt_blocks`` was capped, see
    :func:`capped_prompt_blocks`); ``notes`` say what a person should know about the file
    (e.g. that it holds a header and no records).
    """

    requests: pl.DataFrame
    quarantine: pl.DataFrame
    records_read: int
    prompt_blocks_capped: int = 0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ingested, quarantined = self.requests.height, self.quarantine.height
        if self.records_read != ingested + quarantined:  # a reader bug, never user input
            raise AssertionError(
                f"counts do not reconcile: read {self.records_read} != "
                f"ingested {ingested} + quarantined {quarantined}"
            )


class Reader(ABC):
    """One trace format. ``detect`` looks at content only (never the file name)."""

    name: str
    description: str

    @property
    def needs(self) -> str:
        """What ``detect`` looks for, as a person would check a file for it (listed when no
        reader recognises a file)."""
        return self.description

    @abstractmethod
    def detect(self, head: bytes) -> bool: ...

    @abstractmethod
    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult: ...

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        """:meth:`read`'s rows in chunks of about ``records`` records each (None: one chunk),
        so a large file need not be held whole; this one reads whole (a format that cannot be
        cut into lines). The generator returns the rest of the read: its quarantine, notes
        and capped count, with no rows (``records_read`` counts the quarantined records)."""
        result = self.read(source, ctx)
        yield result.requests
        return ReadResult(
            empty_canonical(),
            result.quarantine,
            result.quarantine.height,
            result.prompt_blocks_capped,
            result.notes,
        )


# A read in chunks of rows (:meth:`Reader.read_chunks`), returning the read's rest.
Chunks = Generator[pl.DataFrame, None, ReadResult]


def drain(chunks: Chunks, sink: Callable[[pl.DataFrame], None]) -> ReadResult:
    """Every chunk handed to ``sink`` in turn; the read's rest (quarantine, notes, no rows)."""
    while True:
        try:
            sink(next(chunks))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def whole(chunks: Chunks) -> ReadResult:
    """The read the chunks make, rows and all, as :meth:`Reader.read` returns it."""
    frames: list[pl.DataFrame] = []
    rest = drain(chunks, frames.append)
    requests = frames[0] if len(frames) == 1 else pl.concat(frames) if frames else empty_canonical()
    return ReadResult(
        requests,
        rest.quarantine,
        requests.height + rest.records_read,
        rest.prompt_blocks_capped,
        rest.notes,
    )


class Quarantine:
    """Collects quarantined records of one file."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self.rows: dict[str, list[Any]] = {name: [] for name in QUARANTINE_SCHEMA.names()}

    def add(self, line: int, field_name: str, reason: str, detail: str = "") -> None:
        self.rows["source_file"].append(self.source.label)
        self.rows["source_line"].append(line)
        self.rows["field"].append(field_name)
        self.rows["reason"].append(reason)
        self.rows["detail"].append(detail)

    def frame(self) -> pl.DataFrame:
        if not self.rows["source_line"]:
            return empty_quarantine()
        return pl.DataFrame(self.rows, schema=QUARANTINE_SCHEMA)


# ---------------------------------------------------------------------------------------------
# Field validation: each returns a clean value or raises RecordError.


def require(obj: Mapping[str, Any], key: str) -> Any:
    if key not in obj or obj[key] is None:
        raise RecordError(key, "missing")
    return obj[key]


def token_count(value: Any, key: str, *, allow_none: bool = False) -> int | None:
    """A token count: a non-negative integer below :data:`MAX_PLAUSIBLE_TOKENS`."""
    if value is None:
        if allow_none:
            return None
        raise RecordError(key, "missing")
    if isinstance(value, bool):
        raise RecordError(key, "not_an_integer", "boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise RecordError(key, "not_an_integer", f"value {value!r}")
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise RecordError(key, "not_an_integer", f"string of length {len(value)}") from None
    elif not isinstance(value, int):
        raise RecordError(key, "not_an_integer", type(value).__name__)
    if value < 0:
        raise RecordError(key, "negative", f"value {value}")
    if value > MAX_PLAUSIBLE_TOKENS:
        raise RecordError(key, "absurd_value", f"value {value} > {MAX_PLAUSIBLE_TOKENS}")
    return int(value)


def number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise RecordError(key, "not_a_number", f"string of length {len(value)}") from None
        else:
            raise RecordError(key, "not_a_number", type(value).__name__)
    if not math.isfinite(value):
        raise RecordError(key, "not_finite", repr(value))
    return float(value)


def optional_text(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise RecordError(key, "not_a_string", type(value).__name__)


def check_arrival(moment: datetime, key: str) -> datetime:
    if not EARLIEST_ARRIVAL <= moment < LATEST_ARRIVAL:
        raise RecordError(key, "implausible_timestamp", moment.isoformat())
    return moment


def seconds_timestamp(value: Any, key: str, anchor: datetime) -> datetime:
    """A timestamp documented in seconds: epoch seconds, or seconds relative to ``anchor``.

    Epoch values that are 10^3 or 10^6 too large are milliseconds or microseconds written
    where seconds belong: quarantined as a unit mix-up rather than placed centuries ahead.
    """
    if isinstance(value, str) and not _looks_numeric(value):
        return iso_timestamp(value, key)
    return epoch_or_relative(number(value, key), key, anchor, "s")


# Units a numeric timestamp may be written in, each 1000 times finer than the one before.
TIME_UNITS = ("s", "ms", "µs", "ns")


def epoch_or_relative(value: float, key: str, anchor: datetime, unit: str) -> datetime:
    """A number of ``unit`` (one of :data:`TIME_UNITS`): an absolute epoch time when it is at
    least :data:`EPOCH_SECONDS_MIN` seconds (2001-09-09), else an offset from ``anchor``.

    A value 10^3, 10^6 or 10^9 times too large for an epoch time in ``unit`` is one written in
    a finer unit: quarantined as ``timestamp_unit_mismatch`` naming the unit it looks like.
    """
    step = TIME_UNITS.index(unit)
    seconds = value / 1000.0**step
    if seconds < 0:
        raise RecordError(key, "negative", f"value {value}")
    for finer in (3, 2, 1):  # 1e11 s is year 5138: no epoch time in `unit` is that large
        if seconds >= EPOCH_SECONDS_MIN * 100 * 1000.0 ** (finer - 1):
            looks = TIME_UNITS[step + finer] if step + finer < len(TIME_UNITS) else "finer than ns"
            raise RecordError(
                key, "timestamp_unit_mismatch", f"value looks like {looks}, expected {unit}"
            )
    if seconds >= EPOCH_SECONDS_MIN:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    else:
        moment = anchor + timedelta(seconds=seconds)
    return check_arrival(moment, key)


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def iso_timestamp(value: Any, key: str) -> datetime:
    if not isinstance(value, str):
        raise RecordError(key, "not_a_timestamp", type(value).__name__)
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RecordError(key, "not_a_timestamp", f"string of length {len(value)}") from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return check_arrival(moment, key)


# ---------------------------------------------------------------------------------------------
# Content to hashes.


def content_blocks(
    prompt_ids: list[int], output_ids: list[int] | None, ctx: ReadContext
) -> tuple[list[int], int]:
    """Chained hashes over prompt (+ output when its tokens are known) and the prompt block count.

    A prompt shorter than one block has no full block: no hash of its own and 0 prompt blocks,
    with its hashes still known (vLLM caches full blocks only, so such a prompt can never hit).
    """
    sequence = prompt_ids + (output_ids or [])
    try:
        hashes = chain_hash_tokens(sequence, ctx.block_size, ctx.salt)
    except ValueError as exc:
        raise RecordError("token_ids", "invalid_token_id", str(exc)) from None
    return hashes.tolist(), len(prompt_ids) // ctx.block_size


# Row key a converter sets when it capped the prompt blocks; JsonLinesReader counts and drops it.
PROMPT_BLOCKS_CAPPED = "_prompt_blocks_capped"


def capped_prompt_blocks(hashed_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """The prompt blocks a row may claim: those hashed, but no more than the authoritative
    ``prompt_tokens`` fill (``prompt_blocks × block_size ≤ prompt_tokens``, which replay needs).

    An approximate tokenizer can render a prompt longer than the provider counted. The blocks
    past the count stay in the chain, where they are what the request leaves in the cache for
    the next turn (whose prompt repeats them), but they are not prompt blocks of this request.
    """
    return min(hashed_blocks, prompt_tokens // block_size)


def token_ids(value: Any, key: str) -> list[int]:
    if not isinstance(value, list):
        raise RecordError(key, "not_a_list", type(value).__name__)
    if not set(map(type, value)) <= {int}:  # exact type: no bool, float or numeric string
        raise RecordError(key, "invalid_token_id", "non-integer entries")
    try:
        array = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise RecordError(key, "invalid_token_id", "non-integer entries") from None
    if array.ndim != 1 or (array.size and (array.min() < 0 or array.max() > 0xFFFFFFFF)):
        raise RecordError(key, "invalid_token_id", "ids must be integers in [0, 2**32)")
    if array.size > MAX_PLAUSIBLE_TOKENS:
        raise RecordError(key, "absurd_value", f"{array.size} tokens")
    return array.tolist()  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# Line-oriented JSON readers.

# Exceptions a converter may hit on shapes it did not expect (a list where a dict belongs, …).
# They quarantine the record rather than abort the file.
_SHAPE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


class JsonLinesReader(Reader):
    """Base for JSON Lines formats: subclasses turn one decoded object into one canonical row."""

    @abstractmethod
    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]: ...

    def detect(self, head: bytes) -> bool:
        first = first_json_object(head)
        return first is not None and self.detect_object(first)

    @abstractmethod
    def detect_object(self, obj: dict[str, Any]) -> bool: ...

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        return whole(self._line_chunks(source, ctx, None))

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        """:meth:`read` line by line, its rows yielded every ``records`` records (None: once);
        a subclass that sets up state around :meth:`read` reads whole (:class:`Reader`)."""
        if type(self).read is not JsonLinesReader.read:
            return super().read_chunks(source, ctx, records)
        return self._line_chunks(source, ctx, records)

    def _line_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        rows: list[dict[str, Any]] = []
        quarantine = Quarantine(source)
        read = capped = pending = kept = 0
        for line_no, obj in iter_json_objects(source, quarantine, ctx):
            pending += 1
            if obj is not None:
                row = self.record_row(obj, source, line_no, ctx, quarantine)
                if row is not None:
                    capped += bool(row.pop(PROMPT_BLOCKS_CAPPED, False))
                    rows.append(row)
            if records is not None and pending >= records:
                read, kept, pending = read + pending, kept + len(rows), 0
                yield canonical_rows(rows)
                rows = []
        if rows or records is None:
            yield canonical_rows(rows)
        return rest_of_read(read + pending, kept + len(rows), quarantine.frame(), capped)

    def read_scanned(
        self, source: SourceFile, ctx: ReadContext, scan: Callable[[bytes], ScannedBlock]
    ) -> ReadResult:
        """What :meth:`read` returns (the same rows, the same quarantine), block of lines by
        block: the lines ``scan`` read with certainty become columns at once, the others are
        decoded with ``json`` and go through :meth:`record_row` as in :meth:`read`."""
        return whole(self.scanned_chunks(source, ctx, scan, None))

    def scanned_chunks(
        self,
        source: SourceFile,
        ctx: ReadContext,
        scan: Callable[[bytes], ScannedBlock],
        records: int | None,
    ) -> Chunks:
        """:meth:`read_scanned`'s rows, yielded every ``records`` records (blank lines do not
        count; None: once, at the end), each chunk in line order."""
        quarantine = Quarantine(source)
        frames: list[pl.DataFrame] = []
        decoded: list[dict[str, Any]] = []
        read = pending = kept = 0
        first_line = 1
        for block, terminated in source.iter_line_blocks(ctx.progress):
            scanned = scan(block)
            used = ~scanned.blank
            read += int(np.count_nonzero(used))
            counted = np.cumsum(used)
            start = 0
            while start < used.size:
                stop = used.size
                if records is not None:
                    before = int(counted[start - 1]) if start else 0
                    stop = min(stop, int(np.searchsorted(counted, before + records - pending)) + 1)
                part = np.zeros(used.size, dtype=np.bool_)
                part[start:stop] = True
                for row in np.flatnonzero(part & used & ~scanned.clean).tolist():
                    line_no = first_line + row
                    raw = block[scanned.bounds[row, 0] : scanned.bounds[row, 1]]
                    obj = json_line_object(raw, terminated, line_no, quarantine)
                    if obj is not None:
                        converted = self.record_row(obj, source, line_no, ctx, quarantine)
                        if converted is not None:
                            decoded.append(converted)
                clean = part & scanned.clean
                if clean.any():
                    frames.append(scanned.columns(clean, np.flatnonzero(clean) + first_line))
                pending += int(np.count_nonzero(part & used))
                if records is not None and pending >= records:
                    chunk = _in_line_order(frames, decoded)
                    kept += chunk.height
                    yield chunk
                    frames, decoded, pending = [], [], 0
                start = stop
            first_line += scanned.blank.size
        if frames or decoded or records is None:
            chunk = _in_line_order(frames, decoded)
            kept += chunk.height
            yield chunk
        return rest_of_read(read, kept, quarantine.frame())

    def record_row(
        self,
        obj: dict[str, Any],
        source: SourceFile,
        line_no: int,
        ctx: ReadContext,
        quarantine: Quarantine,
    ) -> dict[str, Any] | None:
        """One decoded record as a canonical row (lineage filled in), or ``None`` after
        quarantining it with the field and reason its conversion failed on."""
        try:
            row = self.convert(obj, source, line_no, ctx)
        except RecordError as err:
            quarantine.add(line_no, err.field, err.reason, err.detail)
            return None
        except _SHAPE_ERRORS as exc:
            quarantine.add(line_no, "<record>", "malformed_record", type(exc).__name__)
            return None
        row.setdefault("source_format", self.name)
        row.setdefault("source_file", source.label)
        row.setdefault("source_line", line_no)
        row.setdefault("request_id", f"{source.label}:{line_no}")
        row.setdefault("block_size", ctx.block_size)
        return row


@dataclass(frozen=True)
class ScannedBlock:
    """A block of lines as a compiled scanner read it (:meth:`JsonLinesReader.read_scanned`):
    per line, whether it is blank, whether its record was read with certainty (``clean``) and
    its byte span in the block; ``columns(clean_rows, line_numbers)`` makes the canonical rows
    of the clean lines ``clean_rows`` selects."""

    blank: npt.NDArray[np.bool_]
    clean: npt.NDArray[np.bool_]
    bounds: npt.NDArray[np.int64]
    columns: Callable[[npt.NDArray[np.bool_], npt.NDArray[np.int64]], pl.DataFrame]


def rest_of_read(
    read: int,
    kept: int,
    quarantine: pl.DataFrame,
    capped: int = 0,
    notes: tuple[str, ...] = (),
) -> ReadResult:
    """What a read in chunks returns once its rows are yielded: ``read`` records, ``kept`` of
    them yielded as rows, the others in ``quarantine``."""
    if read != kept + quarantine.height:  # a reader bug, never user input
        raise AssertionError(
            f"counts do not reconcile: read {read} != ingested {kept} + "
            f"quarantined {quarantine.height}"
        )
    return ReadResult(empty_canonical(), quarantine, quarantine.height, capped, notes)


def _in_line_order(frames: list[pl.DataFrame], decoded: list[dict[str, Any]]) -> pl.DataFrame:
    """A chunk's rows: the scanned ``frames`` and the ``decoded`` rows, in line order."""
    if decoded:
        frames = [*frames, canonical_rows(decoded)]
    if not frames:
        return canonical_rows([])
    requests = pl.concat(frames, rechunk=False)
    if decoded and len(frames) > 1:
        requests = requests.sort("source_line", maintain_order=True)
    return requests.rechunk()


def chain_column(blocks: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint64]) -> pl.Series:
    """``prefix_hashes`` of rows with ``blocks`` hashes each, ``hashes`` laid end to end."""
    offsets = np.zeros(blocks.size + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    return pl.Series(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(hashes)))


def canonical_rows(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Row dicts (any subset of the canonical columns) as a canonical frame."""
    return pl.from_dicts(rows, schema=CANONICAL_SCHEMA) if rows else empty_canonical()


def iter_json_objects(
    source: SourceFile, quarantine: Quarantine, ctx: ReadContext
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """Every non-blank line as a decoded object, or ``None`` after quarantining it.

    Blank lines are not records and are skipped. A last line that is not valid JSON and has
    no newline is reported as truncated.
    """
    for line_no, (raw, terminated) in enumerate(source.iter_lines(ctx.progress), start=1):
        if not raw.strip():
            continue
        yield line_no, json_line_object(raw, terminated, line_no, quarantine)


def json_line_object(
    raw: bytes, terminated: bool, line_no: int, quarantine: Quarantine
) -> dict[str, Any] | None:
    """The object one non-blank line holds, or ``None`` after quarantining the line (not UTF-8,
    not JSON, truncated when it is the unterminated last line, or not an object)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        quarantine.add(line_no, "<line>", "invalid_utf8", f"byte offset {exc.start}")
        return None
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = "truncated_last_line" if not terminated else "invalid_json"
        position = getattr(exc, "pos", None)
        quarantine.add(line_no, "<line>", reason, f"at column {position}")
        return None
    if not isinstance(obj, dict):
        quarantine.add(line_no, "<line>", "not_an_object", type(obj).__name__)
        return None
    if "\\u" in text and not _encodable(obj):
        # JSON's grammar lets a \u escape name half a UTF-16 pair; such a string is no text
        # (it cannot be stored), so the line is not used.
        quarantine.add(line_no, "<line>", "invalid_utf8", "a \\u escape names a lone surrogate")
        return None
    return obj


def _encodable(obj: Any) -> bool:
    """Every string in ``obj`` (keys too) is valid Unicode text."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Detection looks at this many non-blank lines for the first one that is JSON, so one damaged
# leading line is quarantined like any other instead of making the whole file unrecognised.
DETECT_LINES = 8


def first_json_object(head: bytes) -> dict[str, Any] | None:
    """The first JSON value among the head's first :data:`DETECT_LINES` non-blank lines, when
    it is an object (a line cut off by the end of the head never parses, so it is skipped)."""
    lines = (raw for raw in head.split(b"\n") if raw.strip())
    for _, raw in zip(range(DETECT_LINES), lines, strict=False):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            continue
        return obj if isinstance(obj, dict) else None
    return None
