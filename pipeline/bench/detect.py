"""Parse a benchmark result file; which tool wrote it is decided by content, never by extension.

Parsing (:func:`load_document`): a stream of JSON values in one pass (bare ``Infinity``/``NaN``
accepted, as SGLang writes them) — one value is a JSON document, several are JSON Lines (vLLM
``--append-result`` writes JSONL into a ``.json`` file); text that does not start with ``{`` or
``[`` as YAML (guidellm ``benchmarks.yaml``, inference-perf ``config.yaml``). Each reader's
``FORMAT.detect`` then tells its tool's records apart (:mod:`pipeline.bench.readers`,
docs/bench.md#detection-which-tool-wrote-a-file).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputFormatError, os_reason
from pipeline.safe_read import check_depth, too_deep
from pipeline.settings import parse_yaml


class BenchFormatError(InputFormatError):
    """A benchmark result file matches no known format, or cannot be parsed."""


_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class Document:
    """A parsed file: ``records`` is one element for a JSON/YAML document, one per line for JSONL;
    ``line_numbers`` are the 1-based text lines of the records (1 for a single document)."""

    path: Path
    text_format: str  # "json" | "jsonl" | "yaml"
    records: list[Any]
    line_numbers: list[int]
    raw: bytes


def load_document(path: Path, tried: str) -> Document:
    """The parsed file; ``tried`` (the formats known and what each needs) ends each error."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BenchFormatError(f"{path}: cannot read benchmark file: {os_reason(exc)}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BenchFormatError(
            f"{path}: not a text file (UTF-8 decode failed at byte {exc.start}); {tried}"
        ) from exc
    stripped = text.lstrip()
    if not stripped:
        raise BenchFormatError(f"{path}: empty file; {tried}")
    if stripped[0] not in "{[":
        return _load_yaml(path, text, raw, tried)
    return _load_json_stream(path, text, raw, tried)


def _load_json_stream(path: Path, text: str, raw: bytes, tried: str) -> Document:
    """One JSON document, or several concatenated/line-delimited ones, in a single pass."""
    decoder = json.JSONDecoder()
    records: list[Any] = []
    numbers: list[int] = []
    idx, line, counted_to = 0, 1, 0
    while True:
        idx = _WS.match(text, idx).end()  # type: ignore[union-attr]
        if idx >= len(text):
            break
        line += text.count("\n", counted_to, idx)
        counted_to = idx
        try:
            obj, end = decoder.raw_decode(text, idx)
        except RecursionError as exc:
            raise BenchFormatError(str(too_deep(path))) from exc
        except json.JSONDecodeError as exc:
            if not records:
                raise BenchFormatError(
                    f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column "
                    f"{exc.colno}) — truncated or corrupt?; {tried}"
                ) from exc
            raise BenchFormatError(
                f"{path}: line {line}: not valid JSON ({exc.msg} at column {exc.colno}); "
                "the file is JSON Lines (one result object per line) — truncated?"
            ) from exc
        _check_depth(obj, path)
        records.append(obj)
        numbers.append(line)
        idx = end
    return Document(path, "json" if len(records) == 1 else "jsonl", records, numbers, raw)


def _load_yaml(path: Path, text: str, raw: bytes, tried: str) -> Document:
    try:
        doc = parse_yaml(text)
    except RecursionError as exc:
        raise BenchFormatError(str(too_deep(path))) from exc
    except yaml.YAMLError as exc:
        raise BenchFormatError(f"{path}: neither JSON nor valid YAML ({exc}); {tried}") from exc
    if not isinstance(doc, (dict, list)):
        raise BenchFormatError(f"{path}: content is not a JSON/YAML object or list; {tried}")
    _check_depth(doc, path)
    return Document(path, "yaml", [doc], [1], raw)


def _check_depth(record: Any, path: Path) -> None:
    try:
        check_depth(record, path)
    except InputFormatError as exc:
        raise BenchFormatError(str(exc)) from exc
