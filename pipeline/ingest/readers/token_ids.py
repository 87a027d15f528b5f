"""Token-id JSON Lines: the exact, tokenizer-free input.

Shape::

    {"ts": 3.25, "session_id": "s1", "prompt_token_ids": [1, 2, ...],
     "output_token_ids": [7, 8, ...]}        # or "output_tokens": 42 (a count)

Field choices
-------------
``ts`` (or ``timestamp``)
    Seconds, epoch or relative to the anchor date
    (:func:`~pipeline.ingest.readers.base.seconds_timestamp`: ms / µs epoch values are quarantined as
    a unit mix-up).
``prompt_token_ids``
    Required list of integer ids in ``[0, 2**32)``; ``prompt_tokens`` is its length.
``output_token_ids``
    When present, chained after the prompt ids (the next turn, which repeats them, hits) and
    its length is ``output_tokens``. A separate ``output_tokens`` count is then cross-checked:
    a disagreement is quarantined (``length_mismatch``), since this format claims exactness.
``output_tokens``
    The output count when no ids are given; null when neither is.
optional
    ``session_id`` / ``session`` / ``conversation_id``, ``turn``, ``tenant`` / ``user``,
    ``model``, ``request_id`` / ``id``, ``duration_s`` / ``ttft_s`` (→ ``e2e_ms`` / ``ttft_ms``).

Counts are exact (``tokens_approximate`` is False). Detection: the first object has
``prompt_token_ids``. Token ids are never written anywhere, only their salted chain hashes.

Reading is columnar and streamed, as Mooncake's is: blocks of about 16 MiB of whole lines go
through a compiled scanner (:mod:`pipeline.ingest.readers.token_ids_scan`) into flat arrays (the ids of
a block as one ``uint32`` array, per request its runs in it), the chains of a block's requests
are hashed in one compiled call (:func:`pipeline.ingest.blockhash.chain_hash_token_runs`, the hashes
:func:`pipeline.hashing.chain_hash_tokens` gives), and the rows become columns without a Python
object per token. A line the scanner is not certain of (invalid JSON, a missing, mistyped or
out-of-range field, a count mismatch, escapes, non-ASCII text, nesting, a repeated key, …), a
timestamp outside the plausible range and a non-finite duration go through the line-by-line
path every JSON Lines reader uses (:meth:`convert`), so rows, quarantine reasons and details
are the same as ever.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.ingest.blockhash import chain_hash_token_runs
from pipeline.ingest.readers.base import (
    Chunks,
    JsonLinesReader,
    ReadContext,
    ReadResult,
    RecordError,
    ScannedBlock,
    chain_column,
    require,
    token_count,
    token_ids,
)
from pipeline.ingest.readers.mooncake import scanned_arrivals
from pipeline.ingest.readers.prompt_text import content_row, line_arrival
from pipeline.ingest.readers.source import SourceFile
from pipeline.ingest.readers.token_ids_scan import BLANK, FAST, TEXT_GROUPS, scan_lines
from pipeline.schema import conform


class TokenIdsReader(JsonLinesReader):
    name = "token-ids"
    description = (
        "Token-id JSONL (ts s, session_id, prompt_token_ids, output_token_ids or output_tokens)"
    )

    @property
    def needs(self) -> str:
        return "JSONL, key prompt_token_ids"

    def detect_object(self, obj: dict[str, Any]) -> bool:
        return "prompt_token_ids" in obj

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        """Every line, block by block: the scanner's clean records as columns, the rest
        through :meth:`record_row` (same rows, same quarantine as the line-by-line reader)."""
        return self.read_scanned(source, ctx, lambda block: self._scan(block, source, ctx))

    def read_chunks(self, source: SourceFile, ctx: ReadContext, records: int | None) -> Chunks:
        return self.scanned_chunks(
            source, ctx, lambda block: self._scan(block, source, ctx), records
        )

    def _scan(self, block: bytes, source: SourceFile, ctx: ReadContext) -> ScannedBlock:
        buf, kinds, bounds, ts_int, spans, counts, texts, ids = scan_lines(block)
        fast = kinds == FAST
        arrival, in_range = scanned_arrivals(ts_int, spans[:, 0:2], block, fast, ctx.anchor, 1.0)
        e2e_ms, e2e_ok = _milliseconds(spans[:, 2:4], block, fast)
        ttft_ms, ttft_ok = _milliseconds(spans[:, 4:6], block, fast)

        def columns(clean: npt.NDArray[np.bool_], lines: npt.NDArray[np.int64]) -> pl.DataFrame:
            return self._columns(
                source,
                ctx,
                buf,
                lines=lines,
                arrival=arrival[clean],
                e2e_ms=e2e_ms[clean],
                ttft_ms=ttft_ms[clean],
                counts=counts[clean],
                texts=texts[clean],
                ids=ids,
            )

        return ScannedBlock(kinds == BLANK, fast & in_range & e2e_ok & ttft_ok, bounds, columns)

    def _columns(
        self,
        source: SourceFile,
        ctx: ReadContext,
        buf: npt.NDArray[np.uint8],
        *,
        lines: npt.NDArray[np.int64],
        arrival: npt.NDArray[np.int64],
        e2e_ms: npt.NDArray[np.float64],
        ttft_ms: npt.NDArray[np.float64],
        counts: npt.NDArray[np.int64],
        texts: npt.NDArray[np.int64],
        ids: npt.NDArray[np.uint32],
    ) -> pl.DataFrame:
        """Canonical rows of one block's clean records, as :meth:`convert` would make them."""
        runs = counts[:, 0:4]
        prompt = runs[:, 1]
        blocks = (prompt + runs[:, 3]) // ctx.block_size
        hashes = chain_hash_token_runs(ids, runs, ctx.block_size, ctx.salt)
        output, turn = counts[:, 4], counts[:, 5]
        columns: dict[str, Any] = {
            "arrival": pl.Series(arrival).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
            "turn": pl.Series(turn).set(pl.Series(turn < 0), None),
            "prompt_tokens": prompt,
            "output_tokens": pl.Series(output).set(pl.Series(output < 0), None),
            "e2e_ms": pl.Series(e2e_ms).fill_nan(None),
            "ttft_ms": pl.Series(ttft_ms).fill_nan(None),
            "prefix_hashes": chain_column(blocks, hashes),
            "prompt_blocks": prompt // ctx.block_size,
            "source_line": lines,
        }
        for group, name in enumerate(TEXT_GROUPS):
            columns[name] = _texts(buf, texts[:, group, 0], texts[:, group, 1])
        frame = pl.DataFrame(columns)
        return conform(
            frame.with_columns(
                pl.coalesce("request_id", pl.format("{}:{}", pl.lit(source.label), "source_line")),
                pl.lit(ctx.block_size).alias("block_size"),
                pl.lit(True).alias("hashes_known"),
                pl.lit(False).alias("tokens_approximate"),
                pl.lit(self.name).alias("source_format"),
                pl.lit(source.label).alias("source_file"),
            )
        )

    def convert(
        self, obj: dict[str, Any], source: SourceFile, line: int, ctx: ReadContext
    ) -> dict[str, Any]:
        arrival = line_arrival(obj, ctx)
        prompt_ids = token_ids(require(obj, "prompt_token_ids"), "prompt_token_ids")
        output_ids = None
        if obj.get("output_token_ids") is not None:
            output_ids = token_ids(obj["output_token_ids"], "output_token_ids")
        output_tokens = token_count(obj.get("output_tokens"), "output_tokens", allow_none=True)
        if output_ids is not None:
            if output_tokens is not None and output_tokens != len(output_ids):
                raise RecordError(
                    "output_tokens",
                    "length_mismatch",
                    f"{output_tokens} != {len(output_ids)} output_token_ids",
                )
            output_tokens = len(output_ids)
        return content_row(
            obj, arrival, prompt_ids, output_ids, output_tokens, ctx, approximate=False
        )


def _milliseconds(
    spans: npt.NDArray[np.int64], block: bytes, rows: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Scanned durations in seconds (text spans, start -1 when absent or null) as
    milliseconds (NaN when absent), converted as ``json`` and
    :func:`~pipeline.prompt_text.optional_seconds_as_ms` do (``float`` of the text, times
    1000.0), and whether each row's is certain (a non-finite value is left to the reader)."""
    values = np.full(spans.shape[0], np.nan)
    given = np.flatnonzero(rows & (spans[:, 0] >= 0))
    certain = np.ones(spans.shape[0], dtype=np.bool_)
    if given.size:
        seconds = [float(block[a:b]) for a, b in spans[given].tolist()]
        values[given] = [value * 1000.0 for value in seconds]
        certain[given] = [math.isfinite(value) for value in seconds]
    return values, certain


def _texts(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64]
) -> pl.Series:
    """The ASCII text at each span of ``buf`` as a string column (null where ``starts`` is
    -1), gathered without a Python string per row."""
    present = starts >= 0
    lengths = np.where(present, stops - starts, 0)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.LargeStringArray.from_buffers(
        lengths.size,
        pa.py_buffer(offsets),
        pa.py_buffer(buf[gather]),
        validity,
        null_count=int(lengths.size - np.count_nonzero(present)),
    )
    return pl.Series(array)
