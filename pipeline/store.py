"""On-disk layout of an ingested workload, and atomic writes.

A workload directory holds::

    requests/part-00000.parquet ...   the canonical request table (pipeline.schema), sorted by arrival
    quarantine.parquet                every record that was not ingested, with file, line, field, reason
    ingest_summary.json               counts that reconcile: read = ingested + quarantined

``scan_requests`` returns a lazy frame over the parts, so later stages never load more than
they need. Every file is written to a temporary name in the same directory and renamed into
place, so a reader never sees half a file and a crash never leaves a corrupt one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import InputFormatError
from pipeline.schema import CANONICAL_SCHEMA

REQUESTS_DIR = "requests"
QUARANTINE_FILE = "quarantine.parquet"
SUMMARY_FILE = "ingest_summary.json"
ROWS_PER_PART = 1_000_000


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is renamed onto ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(target: Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(target: Path, payload: Any) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    write_bytes_atomic(target, text.encode())


def write_parquet_atomic(frame: pl.DataFrame, target: Path) -> None:
    # No statistics timestamps or writer-specific metadata vary between runs, so equal frames
    # give equal bytes.
    with atomic_path(target) as tmp:
        frame.write_parquet(tmp, compression="zstd", statistics=True)


def write_requests(requests: pl.DataFrame, workload_dir: Path) -> list[Path]:
    """Replace ``workload_dir/requests`` with ``requests`` split into parts, atomically as a whole."""
    final = workload_dir / REQUESTS_DIR
    workload_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".requests.", dir=workload_dir))
    try:
        n_parts = max(1, -(-requests.height // ROWS_PER_PART))
        for part in range(n_parts):
            chunk = requests.slice(part * ROWS_PER_PART, ROWS_PER_PART)
            chunk.write_parquet(staging / f"part-{part:05d}.parquet", compression="zstd")
        old = workload_dir / f".requests.old.{os.getpid()}"
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(final.glob("part-*.parquet"))


def is_canonical_parquet(path: Path) -> bool:
    """True for a canonical Parquet file or a directory of them (a workload dir or its requests/)."""
    files = parquet_files(path)
    if not files:
        return False
    try:
        schema = pl.read_parquet_schema(files[0])
    except Exception:  # noqa: BLE001 - anything unreadable is simply "not canonical parquet"
        return False
    return all(schema.get(name) == dtype for name, dtype in CANONICAL_SCHEMA.items())


def parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        inner = path / REQUESTS_DIR
        root = inner if inner.is_dir() else path
        return sorted(root.glob("*.parquet"))
    return [path] if path.suffix == ".parquet" or _has_parquet_magic(path) else []


def _has_parquet_magic(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"PAR1"
    except OSError:
        return False


def scan_requests(path: Path) -> pl.LazyFrame:
    """Lazily scan a canonical request table: a workload dir, its requests/ dir, or one file."""
    files = parquet_files(path)
    if not files:
        raise InputFormatError(f"{path}: no canonical Parquet request files found")
    return pl.scan_parquet(files, schema=CANONICAL_SCHEMA)
