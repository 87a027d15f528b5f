"""What the tests of the scanned (columnar) JSON Lines readers share: the reader against the
line-by-line path every JSON Lines reader has (``JsonLinesReader.read``: ``json.loads`` and
``convert`` per line), at the reader and at the ``enginefit ingest`` level."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from pipeline.cli import main as enginefit
from pipeline.ingest.readers import ReadContext, ReadResult, SourceFile
from pipeline.ingest.readers.base import JsonLinesReader


def assert_same_read(reader: JsonLinesReader, path: Path, ctx: ReadContext) -> ReadResult:
    """``reader`` reads ``path`` exactly as the line-by-line path does (rows, quarantine,
    counts, notes), into one chunk; returns its result."""
    source = SourceFile.of(path)
    fast, slow = reader.read(source, ctx), JsonLinesReader.read(reader, source, ctx)
    assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert_frame_equal(fast.quarantine, slow.quarantine)
    assert (fast.records_read, fast.prompt_blocks_capped, fast.notes) == (
        slow.records_read,
        slow.prompt_blocks_capped,
        slow.notes,
    )
    assert fast.requests.n_chunks() == 1
    return fast


def write_lines(path: Path, lines: list[bytes], *, last_newline: bool = True) -> Path:
    path.write_bytes(b"\n".join(lines) + (b"\n" if last_newline else b""))
    return path


def ingest_outputs(
    reader: type[JsonLinesReader],
    trace: Path,
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    reference: bool,
) -> dict[str, str]:
    """``enginefit ingest TRACE --out OUT`` (with ``reference``, ``reader`` reading line by
    line): the SHA-256 of every file it writes."""
    with monkeypatch.context() as patch:
        patch.setenv("ENGINEFIT_HASH_SALT", "test-salt")
        if reference:
            patch.setattr(reader, "read", JsonLinesReader.read)
        assert enginefit(["ingest", str(trace), "--out", str(out), "--anchor", "2025-03-01"]) == 0
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }
