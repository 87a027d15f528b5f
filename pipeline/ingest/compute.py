"""Ingestion: trace files in, one canonical request table (plus its quarantine) out.

Per file: detect the format by content (or use the one named), read every record into
canonical rows or the quarantine. Across files: quarantine repeated request ids (the first
wins), make the block size consistent, sort by arrival (stable: file order, then line) and
report how many records were out of order or shared a timestamp. The summary's counts
reconcile: ``records_read == ingested + quarantined``, per file and in total.
"""

from __future__ import annotations

import glob
import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import polars as pl

from pipeline.errors import InputFormatError
from pipeline.hashing import salt_fingerprint
from pipeline.ingest.result import FileSummary, IngestResult, IngestSummary
from pipeline.readers import ReadContext, SourceFile, detect_reader, reader_named
from pipeline.readers.base import DEFAULT_ANCHOR
from pipeline.schema import QUARANTINE_SCHEMA, empty_quarantine
from pipeline.store import is_canonical_parquet, parquet_files, scan_requests
from pipeline.tokenize import Tokenizer, make_tokenizer


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
                inner = sorted(
                    p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")
                )
                if not inner:
                    raise InputFormatError(f"{match}: directory holds no trace files")
                sources.extend(SourceFile.of(p) for p in inner)
            elif path.is_dir():
                sources.extend(SourceFile.of(p) for p in parquet_files(path))
            else:
                sources.append(SourceFile.of(path, match))
    return sources


def _sha256(source: SourceFile) -> str:
    digest = hashlib.sha256()
    with source.path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _by_reason(quarantine: pl.DataFrame) -> dict[str, int]:
    counts = quarantine.group_by("reason").len().sort("reason")
    return dict(zip(counts["reason"].to_list(), counts["len"].to_list(), strict=True))


def ingest_sources(
    sources: Sequence[SourceFile],
    ctx: ReadContext,
    *,
    fmt: str = "auto",
    formats: Sequence[str] | None = None,
) -> IngestResult:
    """Read every source (format per source from ``formats``, else ``fmt``) into one table."""
    if not sources:
        raise InputFormatError("no trace files given")
    frames, quarantines, file_rows = [], [], []
    for index, source in enumerate(sources):
        name = formats[index] if formats else fmt
        reader = detect_reader(source) if name == "auto" else reader_named(name)
        result = reader.read(source, ctx)
        frames.append(result.requests.with_columns(pl.lit(index, pl.Int32).alias("_file")))
        quarantines.append(result.quarantine)
        file_rows.append((source, reader.name, result))
    requests = pl.concat(frames)
    first_seen = requests.select(pl.col("request_id").is_first_distinct()).to_series()
    duplicated = requests.filter(~first_seen)
    if duplicated.height:  # filtering a wide frame costs; most traces have unique ids
        requests = requests.filter(first_seen)
    duplicate_quarantine = duplicated.select(
        "source_file",
        "source_line",
        pl.lit("request_id").alias("field"),
        pl.lit("duplicate_request_id").alias("reason"),
        pl.lit("an earlier record has the same id").alias("detail"),
    ).cast(QUARANTINE_SCHEMA)
    quarantine = (
        pl.concat([*quarantines, duplicate_quarantine]) if quarantines else empty_quarantine()
    )
    block_size = _workload_block_size(requests, ctx.block_size)
    out_of_order = requests.select(
        (pl.col("arrival") < pl.col("arrival").cum_max().shift(1).over("_file")).sum()
    ).item()
    requests = requests.with_columns(pl.lit(block_size, pl.Int32).alias("block_size"))
    if not requests["arrival"].is_sorted():  # already-sorted traces (the usual case) skip the sort
        requests = requests.sort(["arrival", "_file", "source_line"], maintain_order=True)
    requests = requests.drop("_file")
    duplicate_timestamps = requests.height - requests["arrival"].n_unique()
    files = []
    for source, reader_name, result in file_rows:
        dup = duplicate_quarantine.filter(pl.col("source_file") == source.label).height
        q = pl.concat(
            [result.quarantine, duplicate_quarantine.filter(pl.col("source_file") == source.label)]
        )
        files.append(
            FileSummary(
                file=source.label,
                format=reader_name,
                sha256=_sha256(source),
                records_read=result.records_read,
                ingested=result.requests.height - dup,
                quarantined=result.quarantine.height + dup,
                quarantined_by_reason=_by_reason(q),
            )
        )
    first = requests["arrival"].min() if requests.height else None
    last = requests["arrival"].max() if requests.height else None
    notes = [note for _, _, result in file_rows for note in result.notes]
    if not requests.height:
        notes.append(
            "no record could be ingested; see the quarantine for why"
            if quarantine.height
            else "no record to ingest: the input holds no records"
        )
    capped = sum(result.prompt_blocks_capped for _, _, result in file_rows)
    if capped:
        notes.append(
            f"{capped:,} request(s) hashed to more full prompt blocks than their logged prompt "
            "token count fills (an approximate tokenizer counting more than the provider); "
            "their prompt blocks were capped at the logged count"
        )
    notes.extend(_short_prompt_notes(requests, block_size))
    summary = IngestSummary(
        files=files,
        records_read=sum(f.records_read for f in files),
        ingested=requests.height,
        quarantined=quarantine.height,
        quarantined_by_reason=_by_reason(quarantine),
        out_of_order=int(out_of_order or 0),
        duplicate_timestamps=duplicate_timestamps,
        duplicate_request_ids=duplicate_quarantine.height,
        first_arrival=_iso(first),
        last_arrival=_iso(last),
        span_s=(last - first).total_seconds()
        if isinstance(first, datetime) and isinstance(last, datetime)
        else 0.0,
        block_size=block_size,
        tokenizer=ctx.tokenizer.name,
        tokens_approximate=bool(requests["tokens_approximate"].any()) if requests.height else False,
        salt_fingerprint=salt_fingerprint(ctx.salt),
        prompt_blocks_capped=capped,
        notes=notes,
    )
    if summary.records_read != summary.ingested + summary.quarantined:
        raise AssertionError("ingest counts do not reconcile")  # a bug, never user input
    return IngestResult(requests, quarantine.sort(["source_file", "source_line"]), summary)


def _short_prompt_notes(requests: pl.DataFrame, block_size: int) -> list[str]:
    """Say how many requests with known content fill no block: none of them can be cached."""
    hashed = requests.filter(pl.col("hashes_known"))
    short = hashed.filter(pl.col("prompt_tokens") < block_size).height
    if not short:
        return []
    return [
        f"{short:,} of {hashed.height:,} request(s) with content have prompts shorter than one "
        f"block ({block_size} tokens): no full block, so a prefix cache can never serve them"
    ]


def _iso(moment: object) -> str | None:
    return moment.isoformat() if isinstance(moment, datetime) else None


def _workload_block_size(requests: pl.DataFrame, configured: int) -> int:
    """The one block size of the hashed rows (count-only rows follow it); mixed sizes are an error."""
    hashed = requests.filter(pl.col("hashes_known"))
    sizes = (
        hashed.group_by("block_size")
        .agg(pl.col("source_file").unique().sort().head(3))
        .sort("block_size")
    )
    if sizes.height > 1:
        detail = "; ".join(
            f"{row['block_size']} in {', '.join(row['source_file'])}"
            for row in sizes.iter_rows(named=True)
        )
        raise InputFormatError(
            f"traces in one workload use different block sizes ({detail}); ingest them as separate "
            "workloads or use a block size that divides both"
        )
    return int(sizes["block_size"][0]) if sizes.height else configured


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
    if not salt:
        raise InputFormatError(
            "a hash salt is required (configuration hash_salt or ENGINEFIT_HASH_SALT)"
        )
    tok = (
        tokenizer
        if tokenizer is not None and not isinstance(tokenizer, str)
        else make_tokenizer(tokenizer)
    )
    ctx = ReadContext(
        block_size=block_size, salt=salt, anchor=anchor, tokenizer=tok, progress=progress
    )
    return ingest_sources(expand_paths(paths), ctx, fmt=fmt)


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
