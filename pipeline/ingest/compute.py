"""Ingestion: trace files in, one canonical request table (plus its quarantine) out.

Per file: detect the format by content (or use the one named), read every record into
canonical rows or the quarantine. Across files: quarantine repeated request ids (the first
wins), make the block size consistent, sort by arrival (stable: file order, then line) and
report how many records were out of order or shared a timestamp. The summary's counts
reconcile: ``records_read == ingested + quarantined``, per file and in total.
"""

from __future__ import annotations

import glob
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from pipeline.digests import sha256_file
from pipeline.errors import ConfigError, InputFormatError
from pipeline.hashing import SAMPLE_SALT, salt_fingerprint
from pipeline.ingest.config import SALT_ENV_VAR
from pipeline.ingest.readers import ReadContext, Reader, SourceFile, detect_reader, reader_named
from pipeline.ingest.readers.base import DEFAULT_ANCHOR, EPOCH_SECONDS_MIN, ReadResult, drain
from pipeline.ingest.result import FileSummary, IngestResult, IngestSummary, SkippedFile
from pipeline.ingest.tokenize import Tokenizer, make_tokenizer
from pipeline.schema import QUARANTINE_SCHEMA, empty_canonical, empty_quarantine
from pipeline.store import canonical_files, is_canonical_parquet, scan_requests

# The traces bundled as samples (traces/, see traces/NOTICE), by content: the only ones the
# bundled sample salt may protect without a warning.
BUNDLED_SAMPLE_SHA256 = frozenset(
    {
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",  # mooncake
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",  # azure-code
        "314c49483148fe68e230a683f739e3e6e68d478948ecf342739596f30af36b57",  # tracelab
    }
)
# Relative timestamps from the default anchor land before the first epoch-seconds instant the
# readers accept as absolute; arrivals there are dated from the anchor, not by the trace.
_FIRST_ABSOLUTE = datetime.fromtimestamp(EPOCH_SECONDS_MIN, tz=UTC)
CANONICAL_FORMAT = "canonical-parquet"
# A repeated request id: the first record wins, the later ones are quarantined with this reason
# (here across the files of one ingest, in pipeline.ingest.days across the days of a quarter).
DUPLICATE_ID = "duplicate_request_id"
DUPLICATE_DETAIL = "an earlier record has the same id"
# How a source is read: a format name (``auto``: detected by content), or a reader built for it
# (a ``format: columns`` trace's, from its mapping).
TraceFormat = str | Reader


def expand_paths(paths: Sequence[str | Path]) -> list[SourceFile]:
    """Files named, globbed or inside named directories (sorted), each labelled as given."""
    sources: list[SourceFile] = []
    for given in paths:
        text = str(given)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        if not matches:
            raise InputFormatError(f"{text}: no file matches this pattern")
        for match in matches:
            path = Path(match)
            if path.is_dir() and not is_canonical_parquet(path):
                # Hidden entries (and anything inside hidden folders: staging leftovers, locks,
                # markers) are never traces.
                inner = sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
                if not inner:
                    raise InputFormatError(f"{match}: directory holds no trace files")
                sources.extend(SourceFile.of(p) for p in inner)
            elif path.is_dir():
                sources.extend(SourceFile.of(p) for p in canonical_files(path))
            else:
                sources.append(SourceFile.of(path, match))
    return sources


def _identity(source: SourceFile) -> tuple[Path, str]:
    """The resolved path and SHA-256 of a regular file; what cannot be hashed (missing,
    unreadable, not a regular file) gets "" and is left for its reader to refuse."""
    try:
        resolved = source.path.resolve()
        if not stat.S_ISREG(resolved.stat().st_mode):
            return resolved, ""
        return resolved, sha256_file(resolved)
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop on older Pythons
        return source.path.absolute(), ""


def distinct_sources(
    sources: Sequence[SourceFile],
) -> tuple[list[tuple[int, str]], list[SkippedFile]]:
    """``(index, sha256)`` of each source read, and the ones skipped: a file given again by the
    same resolved path (``./x`` and ``x``, a symlink) or with the same bytes as an earlier one."""
    kept: list[tuple[int, str]] = []
    skipped: list[SkippedFile] = []
    by_path: dict[Path, str] = {}
    by_digest: dict[str, str] = {}
    for index, source in enumerate(sources):
        resolved, digest = _identity(source)
        if resolved in by_path:
            skipped.append(SkippedFile(source.label, by_path[resolved], "same path"))
        elif digest and digest in by_digest:
            skipped.append(SkippedFile(source.label, by_digest[digest], "same content"))
        else:
            by_path[resolved] = source.label
            if digest:
                by_digest[digest] = source.label
            kept.append((index, digest))
    return kept, skipped


def by_reason(quarantine: pl.DataFrame) -> dict[str, int]:
    """Quarantined records per reason, by reason name."""
    counts = quarantine.group_by("reason").len().sort("reason")
    return dict(zip(counts["reason"].to_list(), counts["len"].to_list(), strict=True))


def as_quarantine(
    rows: pl.DataFrame, field: str, reason: str, detail: str | pl.Expr, keep: Sequence[str] = ()
) -> pl.DataFrame:
    """Canonical ``rows`` as quarantine rows naming ``field``, ``reason`` and ``detail`` (with
    the columns ``keep`` carried in front)."""
    detail_expr = pl.lit(detail) if isinstance(detail, str) else detail
    return rows.select(
        *keep,
        "source_file",
        "source_line",
        pl.lit(field).alias("field"),
        pl.lit(reason).alias("reason"),
        detail_expr.alias("detail"),
    ).cast(QUARANTINE_SCHEMA)


def out_of_order(requests: pl.DataFrame, file: str) -> int:
    """Records arriving before an earlier record of the same ``file`` column, in row order."""
    count = requests.select(
        (pl.col("arrival") < pl.col("arrival").cum_max().shift(1).over(file)).sum()
    ).item()
    return int(count or 0)


def dated_from_default_anchor(first_arrival: datetime | str | None) -> bool:
    """Whether arrivals starting at ``first_arrival`` include relative timestamps dated from the
    built-in anchor: those land before the first instant a reader takes as absolute, where no
    absolute timestamp of the plausible range but 2000-2001 falls."""
    if isinstance(first_arrival, str):
        first_arrival = datetime.fromisoformat(first_arrival)
    return first_arrival is not None and first_arrival < _FIRST_ABSOLUTE


def arrival_span(requests: pl.DataFrame) -> tuple[str | None, str | None, float]:
    """First and last arrival (ISO) and the seconds between them; None, None, 0 when empty."""
    first = requests["arrival"].min() if requests.height else None
    last = requests["arrival"].max() if requests.height else None
    if isinstance(first, datetime) and isinstance(last, datetime):
        return first.isoformat(), last.isoformat(), (last - first).total_seconds()
    return None, None, 0.0


@dataclass(frozen=True)
class SourceRead:
    """One distinct source read (what each per-file step of the ``workload`` asset hands on):
    ``position`` among the sources read, the reader's name and result, the file's digest, and
    whether the bundled sample salt hashed a file that is not a bundled sample."""

    position: int
    source: SourceFile
    reader: str
    digest: str
    result: ReadResult
    sample_salted: bool


def read_source(
    source: SourceFile, fmt: TraceFormat, ctx: ReadContext, *, digest: str, position: int
) -> SourceRead:
    """Read one source with the reader ``fmt`` is or names (``auto``: detected by content)."""
    reader = _reader(source, fmt)
    result = reader.read(source, ctx)
    return _source_read(
        source, reader, ctx, digest, position, result, bool(result.requests["hashes_known"].any())
    )


def read_source_chunks(
    source: SourceFile,
    fmt: TraceFormat,
    ctx: ReadContext,
    sink: Callable[[pl.DataFrame], None],
    *,
    digest: str,
    position: int,
    records: int,
) -> SourceRead:
    """:func:`read_source` with the rows handed to ``sink`` in chunks of about ``records``
    records (:meth:`Reader.read_chunks`) instead of held: the read returned has no rows (its
    ``records_read`` counts the quarantined records only)."""
    reader = _reader(source, fmt)
    hashed = False

    def seen(rows: pl.DataFrame) -> None:
        nonlocal hashed
        hashed = hashed or bool(rows["hashes_known"].any())
        sink(rows)

    rest = drain(reader.read_chunks(source, ctx, records), seen)
    return _source_read(source, reader, ctx, digest, position, rest, hashed)


def _reader(source: SourceFile, fmt: TraceFormat) -> Reader:
    if isinstance(fmt, Reader):
        return fmt
    return detect_reader(source) if fmt == "auto" else reader_named(fmt)


def _source_read(
    source: SourceFile,
    reader: Reader,
    ctx: ReadContext,
    digest: str,
    position: int,
    result: ReadResult,
    any_hashed: bool,
) -> SourceRead:
    # Canonical Parquet carries hashes made at its own ingest; every other reader hashed
    # this file's content (or block ids) with ctx.salt just now.
    hashed = reader.name != CANONICAL_FORMAT and any_hashed
    if hashed and not ctx.salt:
        raise ConfigError(
            f"{source.label}: no hash salt, and this trace's prompt content (or block ids) "
            f"is stored as salted hashes: set workload.hash_salt in the configuration "
            f"(--config FILE) or the {SALT_ENV_VAR} environment variable"
        )
    sample_salted = hashed and ctx.salt == SAMPLE_SALT and digest not in BUNDLED_SAMPLE_SHA256
    return SourceRead(position, source, reader.name, digest, result, sample_salted)


def ingest_sources(
    sources: Sequence[SourceFile],
    ctx: ReadContext,
    *,
    fmt: str = "auto",
    formats: Sequence[TraceFormat] | None = None,
    anchor_is_default: bool = False,
) -> IngestResult:
    """Read every source (format per source from ``formats``, else ``fmt``) into one table; a
    file given twice is read once. ``anchor_is_default``: ``ctx.anchor`` is the built-in one."""
    if not sources:
        raise InputFormatError("no trace files given")
    kept, skipped = distinct_sources(sources)
    reads = [
        read_source(
            sources[index],
            formats[index] if formats else fmt,
            ctx,
            digest=digest,
            position=position,
        )
        for position, (index, digest) in enumerate(kept)
    ]
    return merge_reads(reads, ctx, skipped=skipped, anchor_is_default=anchor_is_default)


def merge_reads(
    reads: Sequence[SourceRead],
    ctx: ReadContext,
    *,
    skipped: Sequence[SkippedFile] = (),
    anchor_is_default: bool = False,
) -> IngestResult:
    """The sources read (in any order; merged in ``position`` order) as one table: repeated
    request ids quarantined (the first wins), one block size, sorted by arrival."""
    ordered = sorted(reads, key=lambda read: read.position)
    frames = [
        read.result.requests.with_columns(pl.lit(position, pl.Int32).alias("_file"))
        for position, read in enumerate(ordered)
    ]
    quarantines = [read.result.quarantine for read in ordered]
    # No sources at all: an empty table (a day no trace file covers, pipeline.ingest.days).
    empty = empty_canonical().with_columns(pl.lit(0, pl.Int32).alias("_file"))
    requests = pl.concat(frames) if frames else empty
    first_seen = requests.select(pl.col("request_id").is_first_distinct()).to_series()
    duplicated = requests.filter(~first_seen)
    if duplicated.height:  # filtering a wide frame costs; most traces have unique ids
        requests = requests.filter(first_seen)
    duplicate_rows = as_quarantine(
        duplicated, "request_id", DUPLICATE_ID, DUPLICATE_DETAIL, keep=["_file"]
    )
    duplicate_quarantine = duplicate_rows.drop("_file")
    quarantine = (
        pl.concat([*quarantines, duplicate_quarantine]) if quarantines else empty_quarantine()
    )
    block_size = workload_block_size(requests, ctx.block_size)
    late = out_of_order(requests, "_file")
    requests = requests.with_columns(pl.lit(block_size, pl.Int32).alias("block_size"))
    if not requests["arrival"].is_sorted():  # already-sorted traces (the usual case) skip the sort
        requests = requests.sort(["arrival", "_file", "source_line"], maintain_order=True)
    requests = requests.drop("_file")
    hashed, short = short_prompt_counts(requests, block_size)
    stats = MergeStats(
        ingested=requests.height,
        out_of_order=late,
        duplicate_timestamps=requests.height - requests["arrival"].n_unique(),
        first_arrival=_as_datetime(requests["arrival"].min()),
        last_arrival=_as_datetime(requests["arrival"].max()),
        block_size=block_size,
        hashed=hashed,
        short=short,
        tokens_approximate=(
            bool(requests["tokens_approximate"].any()) if requests.height else False
        ),
    )
    rows = [read.result.requests.height for read in ordered]
    records = [read.result.records_read for read in ordered]
    summary = summarise(
        ordered, rows, records, duplicate_rows, quarantine, stats, ctx, skipped, anchor_is_default
    )
    return IngestResult(requests, quarantine.sort(["source_file", "source_line"]), summary)


def _as_datetime(value: object) -> datetime | None:
    return value if isinstance(value, datetime) else None


@dataclass(frozen=True)
class MergeStats:
    """What the summary says of the merged table (kept rows only), however it was merged."""

    ingested: int
    out_of_order: int
    duplicate_timestamps: int
    first_arrival: datetime | None
    last_arrival: datetime | None
    block_size: int
    hashed: int  # rows with known content
    short: int  # of those, rows whose prompt fills no block
    tokens_approximate: bool


def summarise(
    ordered: Sequence[SourceRead],
    rows: Sequence[int],
    records: Sequence[int],
    duplicate_rows: pl.DataFrame,
    quarantine: pl.DataFrame,
    stats: MergeStats,
    ctx: ReadContext,
    skipped: Sequence[SkippedFile],
    anchor_is_default: bool,
) -> IngestSummary:
    """The summary of a merge: ``ordered`` the reads in position order, ``rows`` their rows
    read (before repeated ids were dropped) and ``records`` their records read (rows and
    quarantined records), ``duplicate_rows`` those dropped (quarantine rows
    with the ``_file`` they came from), ``quarantine`` all quarantined records."""
    files = []
    for position, (read, read_rows, read_records) in enumerate(
        zip(ordered, rows, records, strict=True)
    ):
        result = read.result
        dups = duplicate_rows.filter(pl.col("_file") == position).drop("_file")
        files.append(
            FileSummary(
                file=read.source.label,
                format=read.reader,
                sha256=read.digest,
                records_read=read_records,
                ingested=read_rows - dups.height,
                quarantined=result.quarantine.height + dups.height,
                quarantined_by_reason=by_reason(pl.concat([result.quarantine, dups])),
            )
        )
    first_dt, last_dt = stats.first_arrival, stats.last_arrival
    first = first_dt.isoformat() if isinstance(first_dt, datetime) else None
    last = last_dt.isoformat() if isinstance(last_dt, datetime) else None
    span_s = (
        (last_dt - first_dt).total_seconds()
        if isinstance(first_dt, datetime) and isinstance(last_dt, datetime)
        else 0.0
    )
    notes = [f"skipped {s.file}: {s.reason} as {s.same_as} (read once)" for s in skipped]
    notes += [note for read in ordered for note in read.result.notes]
    if not stats.ingested:
        notes.append(
            "no record could be ingested; see the quarantine for why"
            if quarantine.height
            else "no record to ingest: the input holds no records"
        )
    capped = sum(read.result.prompt_blocks_capped for read in ordered)
    if capped:
        notes.append(
            f"{capped:,} request(s) hashed to more full prompt blocks than their logged prompt "
            "token count fills (an approximate tokenizer counting more than the provider); "
            "their prompt blocks were capped at the logged count"
        )
    if stats.short:
        notes.append(
            f"{stats.short:,} of {stats.hashed:,} request(s) with content have prompts shorter "
            f"than one block ({stats.block_size} tokens): no full block, so a prefix cache can "
            "never serve them"
        )
    warnings = []
    if anchor_is_default and isinstance(first_dt, datetime) and dated_from_default_anchor(first_dt):
        warnings.append(
            f"arrivals start at {first}: relative timestamps dated from the default "
            f"anchor {ctx.anchor.isoformat()}, so the dates are placeholders; set "
            "workload.anchor (or --anchor) to the trace's real start"
        )
    sample_salted = [read.source.label for read in ordered if read.sample_salted]
    if sample_salted:
        warnings.append(
            f"the bundled sample salt protects the hashes of {', '.join(sample_salted)}, which "
            "is not a bundled sample trace: anyone can recompute them; set your own secret "
            f"workload.hash_salt (or {SALT_ENV_VAR}) and ingest again"
        )
    duplicate_ids = duplicate_rows.height
    summary = IngestSummary(
        files=files,
        records_read=sum(f.records_read for f in files),
        ingested=stats.ingested,
        quarantined=quarantine.height,
        quarantined_by_reason=by_reason(quarantine),
        out_of_order=stats.out_of_order,
        duplicate_timestamps=stats.duplicate_timestamps,
        duplicate_request_ids=duplicate_ids,
        first_arrival=first,
        last_arrival=last,
        span_s=span_s,
        block_size=stats.block_size,
        tokenizer=ctx.tokenizer.name,
        tokens_approximate=stats.tokens_approximate,
        salt_fingerprint=salt_fingerprint(ctx.salt) if ctx.salt else None,
        prompt_blocks_capped=capped,
        notes=notes,
        anchor=ctx.anchor.isoformat(),
        anchor_is_default=anchor_is_default,
        skipped_files=list(skipped),
        warnings=warnings,
    )
    if summary.records_read != summary.ingested + summary.quarantined:
        raise AssertionError("ingest counts do not reconcile")  # a bug, never user input
    return summary


def short_prompt_counts(requests: pl.DataFrame | pl.LazyFrame, block_size: int) -> tuple[int, int]:
    """Requests with known content, and those of them whose prompt fills no block (none of
    them can be cached)."""
    # Counted, not filtered: a filter would copy every column of the table, hashes included.
    counts = requests.lazy().select(
        pl.col("hashes_known").sum().alias("hashed"),
        (pl.col("hashes_known") & (pl.col("prompt_tokens") < block_size)).sum().alias("short"),
    )
    hashed, short = counts.collect(engine="streaming").row(0)
    return int(hashed or 0), int(short or 0)


def workload_block_size(requests: pl.DataFrame | pl.LazyFrame, configured: int) -> int:
    """The one block size of the hashed rows (count-only rows follow it); mixed sizes are an error."""
    hashed = requests.lazy().filter(pl.col("hashes_known"))  # lazy: the hashes never read
    # the sizes alone first: grouping every row's source file by size holds the strings
    # (about 5 GB at 100M requests), needed only to name the files when sizes are mixed
    distinct = hashed.select(pl.col("block_size").unique()).collect(engine="streaming")
    if distinct.height > 1:
        sizes = (
            hashed.group_by("block_size")
            .agg(pl.col("source_file").unique().sort().head(3))
            .sort("block_size")
            .collect(engine="streaming")
        )
        detail = "; ".join(
            f"{row['block_size']} in {', '.join(row['source_file'])}"
            for row in sizes.iter_rows(named=True)
        )
        raise InputFormatError(
            f"traces in one workload use different block sizes ({detail}); ingest them as separate "
            "workloads or use a block size that divides both"
        )
    return int(distinct["block_size"][0]) if distinct.height else configured


def ingest_paths(
    paths: Sequence[str | Path],
    *,
    fmt: str = "auto",
    block_size: int = 16,
    salt: bytes = b"",
    anchor: datetime = DEFAULT_ANCHOR,
    tokenizer: Tokenizer | str | None = None,
    progress: Callable[[int], None] | None = None,
) -> IngestResult:
    """Ingest ``paths`` (library use); ``salt`` may be empty when no trace carries content."""
    tok = (
        tokenizer
        if tokenizer is not None and not isinstance(tokenizer, str)
        else make_tokenizer(tokenizer)
    )
    ctx = ReadContext(
        block_size=block_size, salt=salt, anchor=anchor, tokenizer=tok, progress=progress
    )
    return ingest_sources(
        expand_paths(paths), ctx, fmt=fmt, anchor_is_default=anchor == DEFAULT_ANCHOR
    )


def load_requests(
    paths: Sequence[str | Path], ctx: ReadContext, *, fmt: str = "auto"
) -> pl.LazyFrame:
    """The canonical table of ``paths``: scanned when they are canonical Parquet, else read.

    For ad-hoc analysis (the CLI): quarantined records are dropped here; ``ingest_sources``
    keeps them.
    """
    if (
        len(paths) == 1
        and is_canonical_parquet(Path(paths[0]))
        and fmt in ("auto", "canonical-parquet")
    ):
        return scan_requests(Path(paths[0]))
    return ingest_sources(expand_paths(paths), ctx, fmt=fmt).requests.lazy()
