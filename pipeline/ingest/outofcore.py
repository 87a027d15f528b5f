"""The merge of staged reads out of core: what :func:`pipeline.ingest.compute.merge_reads` makes
of the same sources, part by part, never the whole table in memory.

Each source's rows wait in Parquet files (:func:`pipeline.ingest.stage.read_stage`). The merge
reads them back a few columns at a time:

* repeated request ids: a 64-bit hash per row (8 bytes a row); only the rows whose hash repeats
  are read again with their ids, to tell real repeats (the first wins) from hash collisions;
* arrivals of the rows kept (8 bytes a row), per file for the out-of-order count, then sorted
  for the duplicate timestamps, the span and where each request part starts and ends;
* block size, short prompts and approximate tokens: aggregates streamed over the files.

Then each request part is the rows between two arrivals, read with the Parquet statistics
skipping the row groups outside them, sorted as the eager merge sorts (arrival, file, line,
then the row's place in its file: a stable sort) and cut at the same rows. Memory: the two
8-byte columns, one part (at most ``rows_per_part`` rows plus the rows sharing its first or
last arrival) and the quarantine; never the prefix hashes of more than one part.
"""

from __future__ import annotations

import mmap
import platform
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.ingest.compute import (
    DUPLICATE_DETAIL,
    DUPLICATE_ID,
    MergeStats,
    SourceRead,
    as_quarantine,
    short_prompt_counts,
    summarise,
    workload_block_size,
)
from pipeline.ingest.readers import ReadContext
from pipeline.ingest.result import IngestSummary, SkippedFile
from pipeline.schema import empty_quarantine

FILE = "_file"
ROW = "_row"
ARRIVAL = pl.Datetime("us", "UTC")


@dataclass(frozen=True)
class _Source:
    position: int  # among the sources merged, in position order
    rows: tuple[Path, ...]  # its staged rows, in file order
    height: int
    duplicates: tuple[int, ...]  # rows (in file order) dropped as repeated ids

    def scan(self) -> pl.LazyFrame:
        """The staged rows with their file and row in it: the eager merge's concatenation
        order, which breaks ties of its stable sort."""
        return pl.scan_parquet(list(self.rows), row_index_name=ROW).with_columns(
            pl.lit(self.position, pl.Int32).alias(FILE)
        )

    def kept(self) -> pl.LazyFrame:
        if not self.duplicates:
            return self.scan()
        return self.scan().filter(
            ~pl.col(ROW).is_in(pl.Series(self.duplicates, dtype=pl.UInt32).implode())
        )


@dataclass(frozen=True)
class StreamedMerge:
    """The summary and quarantine of a merge, and its request parts made one at a time."""

    summary: IngestSummary
    quarantine: pl.DataFrame
    sources: tuple[_Source, ...]
    arrivals: npt.NDArray[np.int64]  # of the rows kept, sorted
    in_order: bool  # the rows kept are in arrival order as concatenated: no sort
    rows_per_part: int
    hashes: int  # prefix hashes of the rows kept

    def parts(self) -> Iterator[pl.DataFrame]:
        """The request parts in order, each read when asked for (one part, maybe empty, at
        least), as :func:`pipeline.ingest.stage.split_parts` cuts the eager merge's table."""
        total = self.arrivals.size
        n_parts = max(1, -(-total // self.rows_per_part))
        # Stable, as the eager sort: ties in arrival keep file order, then line, then row.
        keys = ["arrival", FILE, ROW] if self.in_order else ["arrival", FILE, "source_line", ROW]
        for index in range(n_parts):
            start = index * self.rows_per_part
            stop = min(total, start + self.rows_per_part)
            if start >= stop:
                window = pl.concat([s.scan().head(0) for s in self.sources]).collect()
                yield self._finish(window)
                continue
            low, high = int(self.arrivals[start]), int(self.arrivals[stop - 1])
            # Rows at the low arrival that belong to the part before this one come first.
            skip = start - int(np.searchsorted(self.arrivals, low, side="left"))
            between = pl.col("arrival").is_between(_instant(low), _instant(high))
            # One source at a time: the scans of all at once decode them side by side.
            window = pl.concat([s.kept().filter(between).collect() for s in self.sources])
            if not self.in_order:  # else concatenated in arrival order already: no sort
                window = window.sort(keys, maintain_order=True)
            part = self._finish(window.slice(skip, stop - start))
            del window  # not held beside the part while it is written
            yield part

    def _finish(self, window: pl.DataFrame) -> pl.DataFrame:
        block_size = pl.lit(self.summary.block_size, pl.Int32).alias("block_size")
        part = window.with_columns(block_size).drop(FILE, ROW).rechunk()
        return part.with_columns(_as_sliced(part["prefix_hashes"], self.hashes))


def _as_sliced(hashes: pl.Series, total: int) -> pl.Series:
    """``hashes`` laid out as a slice of the whole table's column, whose values array holds
    ``total`` hashes: the eager merge writes such slices (its table is one chunk, sorted or
    not, once the block size column is set), and the bytes written follow them: Polars'
    Parquet writer cuts a list column into pages of ``1 MiB // (bytes per row + 1)`` rows,
    its bytes per row the whole values array's size over the row group's rows, and takes no
    page size for one column alone. So the values array is ``total`` long; past this part's
    hashes it is zeros that are never written nor read (:func:`_unwritten_zeros`). Only a
    null chain (a canonical input's) costs more: the writer then spreads the chains'
    validity over the whole values array, a bit per hash of the workload."""
    column = hashes.to_arrow()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    lengths = column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    used = int(offsets[-1])
    values = _unwritten_zeros(max(total, used))
    values[:used] = column.flatten().to_numpy(zero_copy_only=False)
    mask = column.is_null() if column.null_count else None
    laid_out = pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(values, type=pa.uint64()), mask=mask
    )
    series = pl.from_arrow(laid_out)
    assert isinstance(series, pl.Series)
    return series.alias(hashes.name)


# Linux charges a private writable mapping's whole length against its commit limit, written
# or not, unless MAP_NORESERVE is set (Python names it from 3.13; 0x4000 on x86-64 and arm64).
_NORESERVE: int = getattr(
    mmap, "MAP_NORESERVE", 0x4000 if platform.machine() in ("x86_64", "aarch64") else 0
)


def _unwritten_zeros(size: int) -> npt.NDArray[np.uint64]:
    """``size`` zeros that cost memory only where written. ``np.zeros`` takes pages only where
    written too, but Linux counts all of them committed, so one allocation larger than RAM
    and swap fails (at 100M requests of 16-token blocks, a values array of hundreds of GB).
    Mapped without reserve, the zeros cost address space only (unless the machine sets a
    strict commit limit, which counts them whatever the flags)."""
    if sys.platform != "linux" or not _NORESERVE or not size:
        return np.zeros(size, np.uint64)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE
    return np.frombuffer(mmap.mmap(-1, size * 8, flags=flags), np.uint64)


def _instant(microseconds: int) -> pl.Expr:
    return pl.lit(microseconds, pl.Int64).cast(ARRIVAL)


def _duplicates(sources: Sequence[_Source]) -> pl.DataFrame:
    """The rows of a repeated request id after its first (in concatenation order): ``_file``,
    ``_row``, ``source_file``, ``source_line``."""
    # streamed: the ids' strings are read a morsel at a time, only their 8-byte hashes kept
    # (their order does not matter: they are sorted next)
    hashed = np.concatenate(
        [
            s.scan()
            .select(pl.col("request_id").hash())
            .collect(engine="streaming")
            .to_series()
            .to_numpy()
            for s in sources
        ]
    )
    hashed.sort()
    repeated = np.unique(hashed[1:][hashed[1:] == hashed[:-1]])
    del hashed
    columns = [FILE, ROW, "request_id", "source_file", "source_line"]
    if not repeated.size:
        return pl.DataFrame(schema={c: s for c, s in _schema(sources[0]).items() if c in columns})
    candidates = pl.Series(repeated, dtype=pl.UInt64)
    rows = pl.concat(
        [
            s.scan().filter(pl.col("request_id").hash().is_in(candidates.implode())).select(columns)
            for s in sources
        ]
    ).collect()
    rows = rows.sort([FILE, ROW])
    return rows.filter(~pl.col("request_id").is_first_distinct())


def _schema(source: _Source) -> pl.Schema:
    return source.scan().collect_schema()


def merge_staged(
    staged: Sequence[tuple[SourceRead, Sequence[Path]]],
    ctx: ReadContext,
    *,
    skipped: Sequence[SkippedFile] = (),
    anchor_is_default: bool = False,
    rows_per_part: int,
) -> StreamedMerge | None:
    """The merge of ``staged`` (each read, its requests emptied, and the Parquet files of its
    rows; in any order, merged in ``position`` order). None when some arrival is missing:
    the eager merge (which sorts those first) is left to do it."""
    ordered = sorted(staged, key=lambda pair: pair[0].position)
    heights = [
        int(pl.scan_parquet(list(rows)).select(pl.len()).collect().item()) for _, rows in ordered
    ]
    bare = [
        _Source(position, tuple(rows), height, ())
        for position, ((_, rows), height) in enumerate(zip(ordered, heights, strict=True))
    ]
    dup_frame = _duplicates(bare)
    sources = tuple(
        _Source(
            s.position,
            s.rows,
            s.height,
            tuple(dup_frame.filter(pl.col(FILE) == s.position)[ROW].to_list()),
        )
        for s in bare
    )
    per_file: list[npt.NDArray[np.int64]] = []
    late = 0
    in_order = True
    previous_last: int | None = None
    for source in sources:
        arrival = source.kept().select("arrival").collect().to_series()
        if arrival.null_count():
            return None
        values = arrival.to_physical().to_numpy().astype(np.int64, copy=False)
        if values.size:
            running = np.maximum.accumulate(values)
            file_late = int(np.count_nonzero(values[1:] < running[:-1]))
            late += file_late
            if file_late or (previous_last is not None and values[0] < previous_last):
                in_order = False
            previous_last = int(values[-1])
        per_file.append(values)
    arrivals = np.concatenate(per_file) if per_file else np.empty(0, np.int64)
    del per_file
    arrivals.sort()
    total = int(arrivals.size)
    kept = pl.concat([s.kept() for s in sources])
    block_size = workload_block_size(kept, ctx.block_size)
    hashed, short = short_prompt_counts(kept, block_size)
    approximate, hashes = (
        kept.select(pl.col("tokens_approximate").any(), pl.col("prefix_hashes").list.len().sum())
        .collect(engine="streaming")
        .row(0)
    )
    stats = MergeStats(
        ingested=total,
        out_of_order=late,
        duplicate_timestamps=(
            total - 1 - int(np.count_nonzero(arrivals[1:] != arrivals[:-1])) if total else 0
        ),
        first_arrival=_datetime(int(arrivals[0])) if total else None,
        last_arrival=_datetime(int(arrivals[-1])) if total else None,
        block_size=block_size,
        hashed=hashed,
        short=short,
        tokens_approximate=bool(approximate) if total else False,
    )
    duplicate_rows = as_quarantine(
        dup_frame, "request_id", DUPLICATE_ID, DUPLICATE_DETAIL, keep=[FILE]
    )
    reads = [read for read, _ in ordered]
    quarantines = [read.result.quarantine for read in reads]
    quarantine = (
        pl.concat([*quarantines, duplicate_rows.drop(FILE)]) if quarantines else empty_quarantine()
    )
    # As the staged read comes back whole (pipeline.ingest.stage.unstage): rows and quarantine.
    records = [h + read.result.quarantine.height for read, h in zip(reads, heights, strict=True)]
    summary = summarise(
        reads, heights, records, duplicate_rows, quarantine, stats, ctx, skipped, anchor_is_default
    )
    return StreamedMerge(
        summary,
        quarantine.sort(["source_file", "source_line"]),
        sources,
        arrivals,
        in_order,
        rows_per_part,
        int(hashes or 0),
    )


def _datetime(microseconds: int) -> datetime:
    value = pl.Series([microseconds], dtype=pl.Int64).cast(ARRIVAL).item()
    assert isinstance(value, datetime)
    return value
