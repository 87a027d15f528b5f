"""Atomic writes, and reading a canonical request table back lazily.

Every file is written to a temporary name in the same directory and renamed into place, so a
reader never sees half a file and a crash never leaves a corrupt one. ``scan_requests`` returns a
lazy frame over a workload's request parts (paths: :mod:`pipeline.layout`), so later stages never
load more than they need.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import InputFormatError
from pipeline.layout import WorkloadLayout
from pipeline.schema import CANONICAL_SCHEMA


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
        inner = WorkloadLayout(path).ingest.requests
        root = inner if inner.is_dir() else path
        return sorted(root.glob("*.parquet"))
    return [path] if path.suffix == ".parquet" or _has_parquet_magic(path) else []


def _has_parquet_magic(path: Path) -> bool:
    if not path.is_file():  # opening a FIFO would block; the readers refuse it with a reason
        return False
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
