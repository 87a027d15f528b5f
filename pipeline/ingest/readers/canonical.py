"""The canonical Parquet itself (a previous ``enginefit ingest`` output, or any conforming file)."""

from __future__ import annotations

import subprocess
import sys

import polars as pl

from pipeline.errors import InputFormatError
from pipeline.ingest.readers.base import Quarantine, ReadContext, Reader, ReadResult
from pipeline.ingest.readers.source import SourceFile
from pipeline.schema import CANONICAL_SCHEMA, MAX_PLAUSIBLE_TOKENS
from pipeline.settings import MAX_BLOCK_SIZE


class CanonicalParquetReader(Reader):
    name = "canonical-parquet"
    description = "enginefit canonical request table (Parquet)"

    @property
    def needs(self) -> str:
        return "Parquet written by enginefit ingest"

    def detect(self, head: bytes) -> bool:
        return head.startswith(b"PAR1")

    def read(self, source: SourceFile, ctx: ReadContext) -> ReadResult:
        data = source.read_all()
        _check_readable_parquet(data, source)
        try:
            frame = pl.read_parquet(data)
        except Exception as exc:
            raise InputFormatError(f"{source.label}: unreadable Parquet: {exc}") from exc
        wrong = [
            f"{name} (expected {dtype}, found {frame.schema.get(name, 'nothing')})"
            for name, dtype in CANONICAL_SCHEMA.items()
            if frame.schema.get(name) != dtype
        ]
        if wrong:
            raise InputFormatError(
                f"{source.label}: Parquet is not an enginefit request table; columns: "
                + "; ".join(wrong)
            )
        frame = frame.select(CANONICAL_SCHEMA.names()).with_row_index("_row", offset=1)
        blocks = pl.col("prompt_blocks").fill_null(0).cast(pl.Int64)
        block_size = pl.col("block_size").cast(pl.Int64)
        prompt_tokens = pl.col("prompt_tokens").cast(pl.Int64)
        chain = pl.col("prefix_hashes").list.len().fill_null(0)
        problems = [
            ("arrival", "missing", pl.col("arrival").is_null()),
            ("prompt_tokens", "missing", pl.col("prompt_tokens").is_null()),
            ("prompt_tokens", "negative", pl.col("prompt_tokens") < 0),
            ("output_tokens", "negative", pl.col("output_tokens") < 0),
            ("prompt_tokens", "absurd_value", pl.col("prompt_tokens") > MAX_PLAUSIBLE_TOKENS),
            ("output_tokens", "absurd_value", pl.col("output_tokens") > MAX_PLAUSIBLE_TOKENS),
            ("block_size", "missing", pl.col("block_size").is_null() | (pl.col("block_size") <= 0)),
            ("block_size", "absurd_value", pl.col("block_size") > MAX_BLOCK_SIZE),
            # Replay needs prompt_blocks full blocks inside the prompt and in the chain.
            ("prompt_blocks", "exceeds_prompt_tokens", blocks * block_size > prompt_tokens),
            ("prompt_blocks", "exceeds_prefix_hashes", blocks > chain),
        ]
        quarantine = Quarantine(source)
        bad = pl.lit(False)
        for field_name, reason, failed in problems:
            hit = failed.fill_null(False) & ~bad
            for row in frame.filter(hit)["_row"].to_list():
                quarantine.add(int(row), field_name, reason)
            bad = bad | failed.fill_null(False)
        good = frame.filter(~bad).drop("_row")
        notes = () if frame.height else (f"{source.label}: the table has no rows",)
        return ReadResult(good, quarantine.frame(), frame.height, notes=notes)


# polars 2.1 aborts the whole process (a Rust panic, SIGABRT) on some corrupt Parquet files, so
# no except clause can catch it. A child process reads the file first; only if it survives is
# the file read here. Costs one interpreter start per canonical input file.
_PROBE = "import sys, polars as pl; pl.read_parquet(sys.stdin.buffer.read())"


def _check_readable_parquet(data: bytes, source: SourceFile) -> None:
    if len(data) < 12 or not data.startswith(b"PAR1") or not data.endswith(b"PAR1"):
        raise InputFormatError(
            f"{source.label}: not a complete Parquet file (missing PAR1 markers)"
        )
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], input=data, capture_output=True, timeout=600, check=False
    )
    if probe.returncode != 0:
        how = f"signal {-probe.returncode}" if probe.returncode < 0 else f"exit {probe.returncode}"
        last = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise InputFormatError(f"{source.label}: corrupt Parquet ({how}): {last[0][:200]}")
