"""Property tests: no reader crashes on hostile input, and its counts always reconcile.

For every reader in ``READERS`` (canonical Parquet, Mooncake, TraceLab, token ids, OpenAI chat,
prompt text, Azure, BurstGPT) hypothesis feeds

1. arbitrary bytes, and
2. real lines (``../shared/traces`` when present, else the fixtures in ``tests/data/traces``)
   with random mutations: byte flips, truncation, deleted fields, swapped types, huge and
   negative numbers, NaN / infinity.

The reader must either raise :class:`pipeline.errors.InputFormatError` naming the file (a
clean, file-level refusal) or return a :class:`ReadResult`, whose constructor checks ``read =
ingested + quarantined``; every quarantine row must name file, line, field and reason. Any other
error escaping is a bug, and so is refusing a file whose header is intact for its damaged lines:
the valid lines beside them must be read.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import InputFormatError
from pipeline.ingest.readers import (
    READERS,
    ReadContext,
    Reader,
    ReadResult,
    SourceFile,
    detect_reader,
)
from pipeline.schema import CANONICAL_SCHEMA, conform

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "traces"
SHARED = REPO.parent / "shared" / "traces"
CTX = ReadContext(block_size=4, salt=b"prop", anchor=datetime(2025, 1, 1, tzinfo=UTC))
# ENGINEFIT_PROPERTY_EXAMPLES=2000 explores further (randomised); the default run is fixed: 60
# examples a reader and property (each reads a file of its own; the suite runs them all).
_EXAMPLES = int(os.environ.get("ENGINEFIT_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=_EXAMPLES or 60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not _EXAMPLES,
)


def _lines(path: Path, limit: int) -> list[bytes]:
    with path.open("rb") as handle:
        return [line.rstrip(b"\n") for _, line in zip(range(limit), handle, strict=False)]


def _first(*candidates: Path) -> Path:
    return next((p for p in candidates if p.exists()), candidates[-1])


def _parquet_bytes() -> bytes:
    frame = conform(
        pl.DataFrame(
            {
                "request_id": ["a", "b", "c"],
                "arrival": [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 1, 2)],
                "prompt_tokens": [10, 20, 30],
                "output_tokens": [1, 2, 3],
                "block_size": [4, 4, 4],
                "prefix_hashes": [[1, 2], [1, 2, 3], []],
                "prompt_blocks": [2, 2, 0],
                "hashes_known": [True, True, False],
                "tokens_approximate": [False, False, False],
            }
        )
    )
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()


# reader name -> (header line or None, real lines)
def _samples() -> dict[str, tuple[bytes | None, list[bytes]]]:
    mooncake = SHARED / "mooncake-fast25" / "conversation_trace.jsonl"
    azure = SHARED / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
    tracelab = _first(
        SHARED / "tracelab-examples" / "derived" / "round_trace.jsonl",
        REPO / "traces" / "tracelab" / "round_trace.jsonl",
    )
    samples: dict[str, tuple[bytes | None, list[bytes]]] = {
        "tracelab": (None, _lines(tracelab, 19)),
        "token-ids": (None, _lines(DATA / "token_ids.jsonl", 10)),
        "openai-chat": (None, _lines(DATA / "openai_chat.jsonl", 10)),
        "prompt-text": (None, _lines(DATA / "prompt_text.jsonl", 10)),
    }
    burst = _lines(DATA / "burstgpt_v2.csv", 10)
    samples["burstgpt"] = (burst[0], burst[1:])
    if mooncake.exists():
        samples["mooncake"] = (None, _lines(mooncake, 40))
    else:
        samples["mooncake"] = (
            None,
            [b'{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'],
        )
    if azure.exists():
        lines = _lines(azure, 40)
        samples["azure"] = (lines[0], lines[1:])
    else:
        samples["azure"] = (
            b"TIMESTAMP,ContextTokens,GeneratedTokens",
            [b"2023-11-16 18:17:03.9799600,4808,10", b"2023-11-16 18:17:04.0319600,3180,8"],
        )
    return samples


SAMPLES = _samples()
PARQUET = _parquet_bytes()
READER_NAMES = [r.name for r in READERS]


def test_every_reader_has_samples() -> None:
    assert set(READER_NAMES) == set(SAMPLES) | {"canonical-parquet"}


# ---------------------------------------------------------------------------------------------
# The property itself


def run_reader(reader: Reader, data: bytes) -> ReadResult | None:
    """Read ``data`` with ``reader`` (and auto-detection); None when the file was refused.

    Refusing is an :class:`InputFormatError` naming the file, nothing else: any other error (a
    ``ConfigError``, a polars or JSON exception) escaping is the bug this property looks for.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input"
        path.write_bytes(data)
        source = SourceFile.of(path)
        with contextlib.suppress(InputFormatError):
            detect_reader(source)
        try:
            result = reader.read(source, CTX)
        except InputFormatError as exc:
            assert str(exc).startswith(str(path)), str(exc)
            return None
        check_result(result, str(path))
        return result


def check_result(result: ReadResult, label: str) -> None:
    assert result.records_read == result.requests.height + result.quarantine.height
    assert result.requests.schema == CANONICAL_SCHEMA
    q = result.quarantine
    assert (
        q.select("source_file", "source_line", "field", "reason")
        .null_count()
        .sum_horizontal()
        .item()
        == 0
    )
    assert (q["source_file"] == label).all()
    assert (q["source_line"] >= 1).all()
    requests = result.requests
    assert requests["arrival"].null_count() == 0
    assert (requests["prompt_tokens"] >= 0).all()
    assert (requests["output_tokens"].drop_nulls() >= 0).all()
    # What replay needs (pipeline.sim.blocks): a workload that ingests must simulate.
    blocks = requests["prompt_blocks"].fill_null(0).cast(pl.Int64)
    assert (blocks * requests["block_size"].cast(pl.Int64) <= requests["prompt_tokens"]).all()
    assert (blocks <= requests["prefix_hashes"].list.len()).all()


# ---------------------------------------------------------------------------------------------
# Mutations

HOSTILE_VALUES: list[Any] = [
    None,
    True,
    "",
    "x",
    "1e3",
    "2026-01-01T00:00:00Z",
    -1,
    -(10**20),
    0,
    2**31,
    2**63,
    10**30,
    1.5,
    -0.0,
    1e308,
    math.nan,
    math.inf,
    -math.inf,
    [],
    [1, 2],
    [-1],
    {},
    {"a": 1},
    [[1]],
]
HOSTILE_TEXT = [
    b"",
    b"-1",
    b"NaN",
    b"inf",
    b"1e308",
    b"99999999999999999999999",
    b"1767225600000",
    b'"',
    b"\xff",
    b"x",
    b"2026-13-45 25:61:61",
]


def _paths(obj: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if depth > 6:
        return out
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.append((*prefix, key))
            out.extend(_paths(value, (*prefix, key), depth + 1))
    elif isinstance(obj, list):
        for index, value in enumerate(obj[:8]):
            out.append((*prefix, index))
            out.extend(_paths(value, (*prefix, index), depth + 1))
    return out


def mutate_json_line(line: bytes, draw: Callable[[Any], Any]) -> bytes:
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(obj)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["delete", "replace", "replace", "negate"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "negate" and isinstance(parent[path[-1]], int | float):
            parent[path[-1]] = -parent[path[-1]] - 1
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES)))
    return json.dumps(obj).encode()  # NaN / Infinity are written as the JSON extensions


def mutate_csv_line(line: bytes, draw: Callable[[Any], Any]) -> bytes:
    fields = line.split(b",")
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(fields) - 1))
        op = draw(st.sampled_from(["replace", "replace", "delete", "duplicate"]))
        if op == "delete" and len(fields) > 1:
            del fields[index]
        elif op == "duplicate":
            fields.insert(index, fields[index])
        else:
            fields[index] = draw(st.sampled_from(HOSTILE_TEXT))
    return b",".join(fields)


def mutate_bytes(line: bytes, draw: Callable[[Any], Any]) -> bytes:
    op = draw(st.sampled_from(["flip", "truncate", "insert"]))
    if not line:
        return line
    position = draw(st.integers(0, len(line) - 1))
    if op == "truncate":
        return line[:position]
    if op == "insert":
        inserted: bytes = draw(st.binary(min_size=1, max_size=4))
        return line[:position] + inserted + line[position:]
    flipped = line[position] ^ draw(st.integers(1, 255))
    return line[:position] + bytes([flipped]) + line[position + 1 :]


@st.composite
def mutated_file(draw: Callable[[Any], Any], name: str) -> tuple[bytes, int]:
    """A file of real lines, some mutated, and how many valid lines it still holds (0 when
    the CSV header was damaged)."""
    header, lines = SAMPLES[name]
    chosen = draw(st.lists(st.sampled_from(lines), min_size=1, max_size=6))
    structural = mutate_csv_line if header is not None else mutate_json_line
    out = []
    intact = 0
    for line in chosen:
        kind = draw(st.sampled_from(["keep", "structural", "structural", "bytes"]))
        if kind == "structural":
            line = structural(line, draw)
        elif kind == "bytes":
            line = mutate_bytes(line, draw)
        else:
            intact += 1
        out.append(line)
    if header is not None and draw(st.booleans()):
        out.insert(0, header)
    elif header is not None:
        out.insert(0, mutate_bytes(header, draw))
        intact = 0
    body = b"\n".join(out)
    return body + (b"\n" if draw(st.booleans()) else b""), intact


def _reader(name: str) -> Reader:
    return next(r for r in READERS if r.name == name)


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("name", READER_NAMES)
@SETTINGS
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes(name: str, data: bytes) -> None:
    run_reader(_reader(name), data)


@pytest.mark.parametrize("name", [n for n in READER_NAMES if n != "canonical-parquet"])
@SETTINGS
@given(data=st.data())
def test_mutated_real_lines(name: str, data: st.DataObject) -> None:
    body, intact = data.draw(mutated_file(name))
    result = run_reader(_reader(name), body)
    # Damaged lines are quarantined one by one: the valid lines beside them are still read, so
    # a reader that refuses everything fails here.
    if intact:
        assert result is not None and result.requests.height >= intact


# Each plausible Parquet file costs a probe process (see readers/canonical.py): fewer examples.
@settings(SETTINGS, max_examples=_EXAMPLES or 25)
@given(data=st.data())
def test_mutated_parquet(data: st.DataObject) -> None:
    blob = PARQUET
    for _ in range(data.draw(st.integers(1, 4))):
        blob = mutate_bytes(blob, data.draw)
    run_reader(_reader("canonical-parquet"), blob)


@pytest.mark.parametrize("name", [n for n in READER_NAMES if n != "canonical-parquet"])
def test_unmutated_samples_read_cleanly(name: str) -> None:
    header, lines = SAMPLES[name]
    body = b"\n".join(([header] if header is not None else []) + lines) + b"\n"
    result = run_reader(_reader(name), body)
    assert result is not None
    assert result.quarantine.height == 0 and result.requests.height == len(lines)


COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


@pytest.mark.parametrize("codec", sorted(COMPRESS))
@SETTINGS
@given(data=st.data())
def test_truncated_compressed_file_is_never_read_short(codec: str, data: st.DataObject) -> None:
    _, lines = SAMPLES["token-ids"]
    blob = COMPRESS[codec](b"\n".join(lines) + b"\n")
    # Cut anywhere after the 4 magic bytes (shorter, the file is no longer recognisably packed).
    cut = data.draw(st.integers(4, len(blob) - 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cut"
        path.write_bytes(blob[:cut])
        with pytest.raises(InputFormatError) as info:
            _reader("token-ids").read(SourceFile.of(path), CTX)
    assert re.match(
        f"{re.escape(str(path))}: (truncated compressed file|cannot decompress)", str(info.value)
    )
