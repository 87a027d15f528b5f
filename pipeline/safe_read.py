"""Reading a file someone else may have written, without hanging, crashing or trusting it.

``open_regular`` opens only a regular file (a FIFO, a device or a folder is refused at once,
never blocked on). ``parse_json``/``read_json`` are the one JSON reader for enginefit's inputs:
text that is not UTF-8, not JSON, nested deeper than :data:`MAX_DEPTH` levels, or holding a
non-finite number (``NaN``, ``Infinity``, ``1e999``) is one :class:`InputFormatError` naming
the file (and the key), never a traceback.

Benchmark tools' result files are read with ``strict=False``: they may carry bare ``Infinity``
and ``NaN`` (SGLang writes ``"request_rate": Infinity``), which the benchmark readers judge
field by field; only their depth is checked.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pipeline.errors import InputFormatError

# Deeper than any file enginefit writes or reads (its records nest about ten levels); low
# enough that nothing recursing over a parsed value later can exhaust Python's stack.
MAX_DEPTH = 200


@contextmanager
def open_regular(path: Path) -> Iterator[IO[bytes]]:
    """``path`` opened for reading in binary, refused unless it is a regular file. Opened
    non-blocking, so a FIFO with no writer cannot hang the caller before it is refused."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise InputFormatError(f"{path}: not a regular file ({_kind(mode)}); refused")
        os.set_blocking(descriptor, True)
        handle = os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
    with handle:
        yield handle


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a named pipe",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a plain file")


def regular_file_problem(path: Path, *, largest: int) -> str | None:
    """Why ``path`` cannot be read as a small regular file (missing, a folder, a device, a
    pipe, unreadable, larger than ``largest`` bytes), or None when it can."""
    try:
        mode = path.stat()
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be opened ({exc.strerror or exc})"
    if not stat.S_ISREG(mode.st_mode):
        return f"is {_kind(mode.st_mode)}, not a regular file"
    if mode.st_size > largest:
        return f"is {mode.st_size:,} bytes, larger than any such file ({largest:,} bytes)"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def read_regular(path: Path) -> bytes:
    with open_regular(path) as handle:
        return handle.read()


def parse_json(data: bytes | str, where: str | Path, *, strict: bool = True) -> Any:
    """The JSON value in ``data`` (read from ``where``, named in every error)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputFormatError(
                f"{where}: not UTF-8 text (byte {exc.start} cannot be decoded); not a JSON file"
            ) from exc
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise InputFormatError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except RecursionError as exc:
        raise too_deep(where) from exc
    if strict:
        check_value(value, where)
    else:
        check_depth(value, where)
    return value


def read_json(path: Path, *, strict: bool = True) -> Any:
    """:func:`parse_json` of a regular file's content."""
    return parse_json(read_regular(path), path, strict=strict)


def too_deep(where: str | Path) -> InputFormatError:
    return InputFormatError(
        f"{where}: nested more than {MAX_DEPTH} levels deep; not a file enginefit reads"
    )


def check_depth(value: Any, where: str | Path) -> None:
    """Refuse a parsed value nested deeper than :data:`MAX_DEPTH` (level by level, looking only
    at containers: cheap beside the parse, even for a large benchmark file)."""
    level, depth = [value], 1
    while level:
        if depth > MAX_DEPTH:
            raise too_deep(where)
        inner: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                inner.extend(v for v in item.values() if isinstance(v, (dict, list)))
            elif isinstance(item, list):
                inner.extend(v for v in item if isinstance(v, (dict, list)))
        level, depth = inner, depth + 1


def check_value(value: Any, where: str | Path) -> None:
    """Refuse a parsed value nested deeper than :data:`MAX_DEPTH` or holding a non-finite
    number, naming the key (``candidates[2].cost``)."""
    # Each entry: the value, its depth, and where it sits as (parent's place, key), spelled
    # out only for the error.
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]
    while stack:
        item, depth, place = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InputFormatError(
                f"{where}: {_spelled(place)}: {json.dumps(item)} is not a finite number; a JSON input must "
                "hold only finite numbers (a value not known is null)"
            )
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise too_deep(where)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((inner, depth + 1, (place, name)) for name, inner in pairs)


def _spelled(place: Any) -> str:
    """``((None, "candidates"), 2), "cost")`` → ``candidates[2].cost``."""
    parts: list[str] = []
    while place is not None:
        place, name = place
        parts.append(f"[{name}]" if isinstance(name, int) else f".{name}")
    return "".join(reversed(parts)).lstrip(".") or "the document"
