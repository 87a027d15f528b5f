"""Opening trace files: transparent gzip/zstd streaming (by magic bytes), heads and lines.

Only regular files are read (symbolic links to them included). A FIFO, a ``<(…)`` pipe
(``/dev/fd/N``), a socket or a device is refused with one line: a trace is read more than
once (detection, the read itself, its checksum), which a stream cannot give, and a FIFO
without a writer would block forever. Opening never blocks: the file is opened non-blocking and
checked with ``fstat`` before a byte is read, so nothing can swap a FIFO in between.

A compressed file must be complete: a gzip or zstd stream that ends mid-member or mid-frame is
an error naming the file, never a silently shorter trace. A UTF-8 byte-order mark at the start
of the (decompressed) content is skipped, so JSON Lines and CSV files saved by editors that
write one read like any other.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from pipeline.errors import InputFormatError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UTF8_BOM = b"\xef\xbb\xbf"
HEAD_BYTES = 256 * 1024
# Detection needs the first record whole. A JSON record longer than the head is read on up to
# this bound (a chat log with a 1M-token context is ~4 MB; inline images make it tens of MB);
# past it the format must be named (``--format``), which reads without detecting.
DETECT_MAX_BYTES = 256 * 1024 * 1024
CHUNK_BYTES = 16 * 1024 * 1024
# Compressed bytes fed to the zstd decoder per step (the output is a small multiple of it).
_ZSTD_INPUT_BYTES = 1024 * 1024
# Errors a decompressor raises on damaged input.
_DECODE_ERRORS = (zstandard.ZstdError, zlib.error, gzip.BadGzipFile)
_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO or pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True)
class SourceFile:
    """A trace file: ``path`` to open, ``label`` to record as lineage (the path as the user gave it)."""

    path: Path
    label: str

    @classmethod
    def of(cls, path: str | Path, label: str | None = None) -> SourceFile:
        return cls(Path(path), label if label is not None else str(path))

    def open(self) -> BinaryIO:
        """A binary stream of the decompressed content (nothing is unpacked to disk), after any
        UTF-8 byte-order mark."""
        raw = self._open_regular()
        try:
            kind = _compression(raw.peek(4)[:4])
            stream: io.BufferedReader | gzip.GzipFile = raw
            if kind == "gzip":
                stream = _GzipStream(raw)
            elif kind == "zstd":
                stream = io.BufferedReader(_ZstdFrames(raw), buffer_size=1024 * 1024)
            if stream.peek(len(UTF8_BOM))[: len(UTF8_BOM)] == UTF8_BOM:
                stream.read(len(UTF8_BOM))
        except BaseException:
            raw.close()
            raise
        return stream  # type: ignore[return-value]

    def size(self) -> int:
        """The file's size on disk (after the same checks as opening it)."""
        with self._open_regular() as raw:
            return os.fstat(raw.fileno()).st_size

    def head(self, limit: int = HEAD_BYTES) -> bytes:
        """The first ``limit`` decompressed bytes, extended to the end of the first line when
        that line starts a JSON record (up to :data:`DETECT_MAX_BYTES`), so detection sees one
        whole record whatever its size."""
        with self._reading(), self.open() as stream:
            head = stream.read(limit)
            if not _first_record_open(head):
                return head
            parts = [head]
            size = len(head)
            while chunk := stream.read(CHUNK_BYTES):
                parts.append(chunk)
                size += len(chunk)
                if b"\n" in chunk:
                    break
                if size > DETECT_MAX_BYTES:
                    raise InputFormatError(
                        f"{self.label}: the first record is longer than "
                        f"{DETECT_MAX_BYTES // 2**20} MiB, too long to detect the format; "
                        "name it with --format (or the trace's `format:` in the configuration)"
                    )
            return b"".join(parts)

    def read_all(self) -> bytes:
        with self._reading(), self.open() as stream:
            return stream.read()

    def iter_lines(
        self, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[bytes, bool]]:
        """Every line without its newline, and whether a newline ended it, streamed in chunks.

        Only the last line can be unterminated, which is how a truncated file shows.
        ``progress`` is called with the number of decompressed bytes consumed per chunk.
        """
        for block, terminated in self.iter_line_blocks(progress):
            if not terminated:
                yield block, False
                continue
            lines = block.split(b"\n")
            lines.pop()  # the empty remainder after the block's last newline
            for line in lines:
                yield line, True

    def iter_line_blocks(
        self, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[bytes, bool]]:
        """The content as blocks of whole lines, streamed: each block is about
        :data:`CHUNK_BYTES` of lines that each end with a newline (``True``), except the file's
        last line when no newline ends it, which comes alone as the last block (``False``).
        A line longer than a chunk makes its block that much longer. ``progress`` as for
        :meth:`iter_lines`.
        """
        with self._reading(), self.open() as stream:
            tail = b""
            while chunk := stream.read(CHUNK_BYTES):
                if progress:
                    progress(len(chunk))
                data = tail + chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    yield data[:cut], True
                tail = data[cut:]
            if tail:
                yield tail, False

    # -- shell -----------------------------------------------------------------------------

    def _open_regular(self) -> io.BufferedReader:
        """The raw file, opened without blocking and refused unless it is a regular file."""
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags)
        except OSError as exc:
            raise InputFormatError(f"{self.label}: {self._open_problem(exc)}") from exc
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise InputFormatError(f"{self.label}: is a directory, not a trace file")
            if not stat.S_ISREG(mode):
                kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
                raise InputFormatError(
                    f"{self.label}: is {kind}, not a regular file; a trace is read more than "
                    "once (to detect its format, to read it, to checksum it), so save the "
                    "stream to a file first (e.g. `cat … > trace.jsonl`) and name that file"
                )
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def _open_problem(self, exc: OSError) -> str:
        """What is wrong with a path that cannot be opened, in words a person can act on."""
        path = self.path
        if exc.errno == errno.ENOENT and path.is_symlink():
            return f"broken symbolic link: it points to {path.readlink()}, which does not exist"
        if exc.errno == errno.ENOENT:
            return "file not found"
        if exc.errno == errno.ELOOP:
            return "symbolic link loop: the link leads back to itself; fix or remove it"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return "permission denied: the file (or a folder above it) is not readable by you"
        return f"cannot open: {exc.strerror or exc}"

    def _reading(self) -> _ReadErrors:
        return _ReadErrors(self.label)


class _ReadErrors:
    """Turns I/O and decompression failures while reading into one-line errors naming the file.

    Errors already phrased for a person (:class:`InputFormatError`) pass through unchanged.
    """

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> None:
        if exc is None or isinstance(exc, InputFormatError):
            return
        if isinstance(exc, EOFError):
            raise InputFormatError(
                f"{self.label}: truncated compressed file ({exc}); the file is incomplete: "
                "copy or download it again"
            ) from exc
        if isinstance(exc, _DECODE_ERRORS):
            raise InputFormatError(f"{self.label}: cannot decompress: {exc}") from exc
        if isinstance(exc, PermissionError):
            raise InputFormatError(
                f"{self.label}: permission denied while reading the file"
            ) from exc
        if isinstance(exc, OSError):
            raise InputFormatError(
                f"{self.label}: cannot read the file: {exc.strerror or exc}"
            ) from exc


class _GzipStream(gzip.GzipFile):
    """A gzip stream that closes the file it reads (``GzipFile`` leaves a given file open)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw)
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class _ZstdFrames(io.RawIOBase):
    """Decompressed zstd content, frame after frame, that fails on a frame cut short.

    ``zstandard``'s stream reader ends quietly where a truncated file ends, which loses the
    rest of the trace without a word; this decoder raises :class:`EOFError` instead.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while self._offset >= len(self._pending):
            data = self._raw.read(_ZSTD_INPUT_BYTES)
            if not data:
                if self._in_frame:
                    raise EOFError("the zstd stream ends in the middle of a frame")
                return 0
            self._pending, self._offset = memoryview(self._decode(data)), 0
        n = min(len(buffer), len(self._pending) - self._offset)
        buffer[:n] = self._pending[self._offset : self._offset + n]
        self._offset += n
        return n

    def _decode(self, data: bytes) -> bytes:
        out = []
        while data:
            self._in_frame = True
            out.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data = self._frame.unused_data  # the next frame (concatenated .zst files)
            self._frame = self._decompressor.decompressobj()
            self._in_frame = False
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _compression(magic: bytes) -> str | None:
    if magic.startswith(GZIP_MAGIC):
        return "gzip"
    if magic.startswith(ZSTD_MAGIC):
        return "zstd"
    return None


def _first_record_open(head: bytes) -> bool:
    """Whether ``head`` ends inside its first non-blank line and that line starts a JSON
    object (CSV headers and binary formats are judged on the head alone)."""
    start = len(head) - len(head.lstrip(b" \t\r\n"))
    return head[start : start + 1] == b"{" and b"\n" not in head[start:]


def first_nonblank_line(head: bytes) -> bytes:
    for line in head.split(b"\n"):
        if line.strip():
            return line.strip()
    return b""
