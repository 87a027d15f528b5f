"""Mooncake FAST'25 JSONL: ``timestamp`` (ms since trace start), lengths, 512-token ``hash_ids``.

``timestamp``
    Milliseconds since the trace started, placed after the configured anchor date, as the
    published traces write it. A value of at least 10^12 ms cannot be an offset (it would be
    31 years into the trace) but is an epoch time in ms, as traces converted from a service's
    own logs write it: it is taken as that absolute time (1767225600000 is
    2026-01-01T00:00:00Z), not as the anchor plus 56 years. Values 10^3 times larger still (µs
    or ns epochs) are quarantined as ``timestamp_unit_mismatch``
    (:func:`~pipeline.ingest.readers.base.epoch_or_relative`).
``input_length`` / ``output_length``
    Prompt and output tokens (exact).
``hash_ids``
    One id per 512-token prompt block, the last one possibly partial (so exactly
    ⌈input_length / 512⌉ ids, else ``length_mismatch``). Only full blocks are cacheable: the
    partial last block's id is dropped, and ``prompt_blocks`` is ⌊input_length / 512⌋.

Reading is columnar and streamed: blocks of about 16 MiB of whole lines go through a compiled
scanner (:mod:`pipeline.ingest.readers.mooncake_scan`) into arrays, each request's ids are chain-hashed
in a compiled kernel (:func:`pipeline.ingest.blockhash.chain_hash_id_runs`), and the rows become
columns without a Python object per request or per block id, so memory holds one block of the
file plus the table being built. A line the scanner is not certain of (invalid JSON, a missing,
mistyped or out-of-range field, a count mismatch, an id past 64 bits, escapes, nesting, …) and a
timestamp outside the plausible range go through the line-by-line path every JSON Lines reader
uses (:meth:`convert`), so quarantine reasons and details are the same as ever.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.hashing import chain_hash_block_ids
from pipeline.ingest.blockhash import chain_hash_id_runs
from pipeline.ingest.readers.base import (
    EARLIEST_ARRIVAL,
    EPOCH_SECONDS_MIN,
    LATEST_ARRIVAL,
    Chunks,
    JsonLinesReader,
    ReadContext,
    ReadResult,
    RecordError,
    ScannedBlock,
    chain_column,
    epoch_or_relative,
    number,
    require,
    token_count,
)
from pipeline.ingest.readers.mooncake_scan import BLANK, BLOCK_TOKENS, FAST, KEYS, scan_lines
from pipeline.ingest.readers.source import SourceFile
from pipeline.schema import conform

MOONCAKE_BLOCK_TOKENS = BLOCK_TOKENS
_KEYS = set(KEYS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_EARLIEST_US = (EARLIEST_ARRIVAL - _EPOCH) // _US
_LATEST_US = (LATEST_ARRIVAL - _EPOCH) // _US
# epoch_or_relative's bound in seconds (the same for values in s and in ms): from here on a
# value is in a finer unit (quarantined there).
_UNIT_MISMATCH_SECONDS = EPOCH_SECONDS_MIN * 100


class MooncakeReader(JsonLinesReader):
    name = "mooncake"
    description = (
        "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids of 512-token blocks)"
    )

    @property
    def needs(self) -> str:
        return f"JSONL, keys {', '.join(KEYS)}"

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return obj.keys() >= _KEYS

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        """Every line, block by block: the scanner's clean records as columns, the rest
        through :meth:`record_row` (same rows, same quarantine as the line-by-line reader)."""
        return self.read_scanned(source, ctx, lambda block: self._scan(block, source, ctx))

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        return self.scanned_chunks(
            source, ctx, lambda block: self._scan(block, source, ctx), records
        )

    def _scan(self, block: bytes, source: SourceFile, ctx: ReadContext) -> ScannedBlock:
        kinds, bounds, ts_int, ts_span, lengths, ids, id_runs = scan_lines(
            np.frombuffer(block, dtype=np.uint8)
        )
        fast = kinds == FAST
        arrival, in_range = scanned_arrivals(ts_int, ts_span, block, fast, ctx.anchor, 1000.0)

        def columns(clean: npt.NDArray[np.bool_], lines: npt.NDArray[np.int64]) -> pl.DataFrame:
            return self._columns(
                source,
                ctx,
                lines=lines,
                arrival=arrival[clean],
                lengths=lengths[clean],
                ids=ids,
                id_starts=id_runs[clean, 0],
            )

        return ScannedBlock(kinds == BLANK, fast & in_range, bounds, columns)

    def _columns(
        self,
        source: SourceFile,
        ctx: ReadContext,
        *,
        lines: npt.NDArray[np.int64],
        arrival: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        ids: npt.NDArray[np.int64],
        id_starts: npt.NDArray[np.int64],
    ) -> pl.DataFrame:
        """Canonical rows of one block's clean records, as :meth:`convert` would make them."""
        prompt = lengths[:, 0]
        full = prompt // MOONCAKE_BLOCK_TOKENS
        hashes = chain_hash_id_runs(ids, id_starts, full, ctx.salt)
        frame = pl.DataFrame(
            {
                "arrival": pl.Series(arrival).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
                "prompt_tokens": prompt,
                "output_tokens": lengths[:, 1],
                "prefix_hashes": chain_column(full, hashes),
                "prompt_blocks": full,
                "source_line": lines,
            }
        )
        return conform(
            frame.with_columns(
                pl.format("{}:{}", pl.lit(source.label), "source_line").alias("request_id"),
                pl.lit(MOONCAKE_BLOCK_TOKENS).alias("block_size"),
                pl.lit(True).alias("hashes_known"),
                pl.lit(False).alias("tokens_approximate"),
                pl.lit(self.name).alias("source_format"),
                pl.lit(source.label).alias("source_file"),
            )
        )

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        arrival = epoch_or_relative(
            number(require(obj, "timestamp"), "timestamp"), "timestamp", ctx.anchor, "ms"
        )
        prompt = token_count(require(obj, "input_length"), "input_length")
        output = token_count(require(obj, "output_length"), "output_length")
        ids = require(obj, "hash_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise RecordError("hash_ids", "not_a_list_of_integers")
        assert prompt is not None
        expected = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != expected:
            raise RecordError(
                "hash_ids",
                "length_mismatch",
                f"{len(ids)} ids for {prompt} tokens, expected {expected}",
            )
        full = prompt // MOONCAKE_BLOCK_TOKENS
        return {
            "arrival": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "block_size": MOONCAKE_BLOCK_TOKENS,
            "prefix_hashes": chain_hash_block_ids(ids[:full], ctx.salt).tolist(),
            "prompt_blocks": full,
            "hashes_known": True,
            "tokens_approximate": False,
        }


def scanned_arrivals(
    ts_int: npt.NDArray[np.int64],
    ts_span: npt.NDArray[np.int64],
    block: bytes,
    rows: npt.NDArray[np.bool_],
    anchor: datetime,
    per_second: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Arrival (µs since the epoch, UTC) of each scanned timestamp, written in units of which
    ``per_second`` make a second (1000.0 for ms, 1.0 for s), and whether it is certainly what
    :func:`~pipeline.ingest.readers.base.epoch_or_relative` gives and accepts.

    The arithmetic is Python's own: ``float(value) / per_second`` seconds, split into whole seconds and
    a fraction whose microseconds are rounded half to even (what ``datetime.fromtimestamp`` and
    ``timedelta(seconds=…)`` both do), as an epoch time from 10^9 s on, else after ``anchor``.
    Rows outside the plausible years or the unit bound are left to that function (which
    quarantines them with its detail), as are relative times after an anchor whose UTC offset
    can change (Python adds those as wall-clock time).
    """
    value = ts_int.astype(np.float64)
    spans = np.flatnonzero(rows & (ts_span[:, 0] >= 0))
    if spans.size:  # a fraction or an exponent: converted as json does, with float()
        value[spans] = [float(block[a:b]) for a, b in ts_span[spans].tolist()]
    seconds = value / per_second
    valid = rows & np.isfinite(seconds) & (seconds >= 0) & (seconds < _UNIT_MISMATCH_SECONDS)
    seconds = np.where(valid, seconds, 0.0)
    fraction, whole = np.modf(seconds)
    micros = whole.astype(np.int64) * 1_000_000 + np.rint(fraction * 1e6).astype(np.int64)
    epoch = seconds >= EPOCH_SECONDS_MIN
    if isinstance(anchor.tzinfo, timezone):  # a fixed offset: anchor + t is the instant + t
        arrival = np.where(epoch, micros, (anchor - _EPOCH) // _US + micros)
    else:
        arrival, valid = micros, valid & epoch
    return arrival, valid & (arrival >= _EARLIEST_US) & (arrival < _LATEST_US)
