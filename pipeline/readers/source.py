"""Opening trace files: transparent gzip/zstd streaming (by magic bytes), heads and lines."""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from pipeline.errors import InputFormatError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HEAD_BYTES = 256 * 1024
CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """A trace file: ``path`` to open, ``label`` to record as lineage (the path as the user gave it)."""

    path: Path
    label: str

    @classmethod
    def of(cls, path: str | Path, label: str | None = None) -> SourceFile:
        return cls(Path(path), label if label is not None else str(path))

    def compression(self) -> str | None:
        try:
            with self.path.open("rb") as handle:
                magic = handle.read(4)
        except FileNotFoundError as exc:
            raise InputFormatError(f"{self.label}: file not found") from exc
        except IsADirectoryError as exc:
            raise InputFormatError(f"{self.label}: is a directory, not a trace file") from exc
        if magic.startswith(GZIP_MAGIC):
            return "gzip"
        if magic.startswith(ZSTD_MAGIC):
            return "zstd"
        return None

    def open(self) -> BinaryIO:
        """A binary stream of the decompressed content (nothing is unpacked to disk)."""
        kind = self.compression()
        raw = self.path.open("rb")
        if kind == "gzip":
            return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
        if kind == "zstd":
            reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
            return io.BufferedReader(reader)  # type: ignore[arg-type]
        return raw

    def size(self) -> int:
        return self.path.stat().st_size

    def head(self, limit: int = HEAD_BYTES) -> bytes:
        try:
            with self.open() as stream:
                return stream.read(limit)
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise InputFormatError(f"{self.label}: cannot decompress: {exc}") from exc

    def read_all(self) -> bytes:
        try:
            with self.open() as stream:
                return stream.read()
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise InputFormatError(f"{self.label}: cannot decompress: {exc}") from exc

    def iter_lines(
        self, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[bytes, bool]]:
        """Every line without its newline, and whether a newline ended it, streamed in chunks.

        Only the last line can be unterminated, which is how a truncated file shows.
        ``progress`` is called with the number of decompressed bytes consumed per chunk.
        """
        try:
            with self.open() as stream:
                tail = b""
                while chunk := stream.read(CHUNK_BYTES):
                    if progress:
                        progress(len(chunk))
                    lines = (tail + chunk).split(b"\n")
                    tail = lines.pop()
                    for line in lines:
                        yield line, True
                if tail:
                    yield tail, False
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise InputFormatError(f"{self.label}: cannot decompress: {exc}") from exc


def first_nonblank_line(head: bytes) -> bytes:
    for line in head.split(b"\n"):
        if line.strip():
            return line.strip()
    return b""
