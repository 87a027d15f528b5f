"""The columnar Mooncake reader writes exactly what the line-by-line reader writes.

``MooncakeReader.read`` scans blocks of lines into columns and hashes the ids in a compiled
kernel; the reference is the line-by-line path every JSON Lines reader has
(``JsonLinesReader.read``: ``json.loads`` and :meth:`MooncakeReader.convert` per line), which
is how Mooncake traces were read before. On the bundled sample and on generated files full of
hostile records, ``enginefit ingest`` with either writes byte-identical canonical Parquet,
quarantine and summary, and the reader's rows and quarantine are equal frame for frame, also
with blocks cut small enough that every record boundary lands somewhere new.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline.ingest.readers.source as source_module
from pipeline.errors import InputFormatError
from pipeline.ingest.readers import ReadContext, ReadResult, SourceFile
from pipeline.ingest.readers.mooncake import MooncakeReader
from pipeline.schema import MAX_PLAUSIBLE_TOKENS
from tests import columnar_readers
from tests.columnar_readers import write_lines

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
ANCHOR = datetime(2025, 3, 1, tzinfo=UTC)
READER = MooncakeReader()


def assert_same_read(path: Path, ctx: ReadContext) -> ReadResult:
    return columnar_readers.assert_same_read(READER, path, ctx)


def record(ts: Any = 0, length: Any = 1100, out: Any = 7, ids: Any = None) -> dict[str, Any]:
    if ids is None:
        ids = list(range(-(-length // 512))) if isinstance(length, int) and length >= 0 else []
    return {"timestamp": ts, "input_length": length, "output_length": out, "hash_ids": ids}


def dumps(obj: Any, **kwargs: Any) -> bytes:
    return json.dumps(obj, **kwargs).encode()


def hostile_lines() -> Iterator[bytes]:
    """Every kind of record a Mooncake file may hold, good and bad, one per line."""
    yield dumps(record())
    yield dumps(record(ts=1_767_225_600_000))  # epoch ms: absolute
    yield dumps(record(ts=1_767_225_600_123.5))  # epoch ms with a fraction
    yield dumps(record(ts=27_000.25))  # relative, fractional ms
    yield b'{"timestamp": 2.5e3, "input_length": 512, "output_length": 1, "hash_ids": [9]}'
    yield b'{"timestamp": 1E+2, "input_length": 512, "output_length": 1, "hash_ids": [9]}'
    yield b'{"timestamp": 0.0000004, "input_length": 512, "output_length": 1, "hash_ids": [9]}'
    yield b'{"timestamp": 0.0000005, "input_length": 512, "output_length": 1, "hash_ids": [9]}'
    yield b'{"timestamp": 0.0000015, "input_length": 512, "output_length": 1, "hash_ids": [9]}'
    yield b'{"timestamp": 999999999999.9995, "input_length": 0, "output_length": 1, "hash_ids": []}'
    yield dumps(record(ts=1_767_225_600_000_000))  # µs epoch: unit mismatch
    yield dumps(record(ts=1_767_225_600_000_000_000))  # ns epoch
    yield dumps(record(ts=10**40))  # past every unit
    yield dumps(record(ts=99_999_999_999_999))  # 15 digits: year ~5138, implausible
    yield dumps(record(ts=4_200_000_000_000))  # epoch ms in 2103: implausible
    yield dumps(record(ts=1_000_000_000_000 - 1))  # just below the epoch bound: relative
    yield dumps(record(ts=1_000_000_000_000))  # 2001-09-09: absolute
    yield dumps(record(ts=-5))
    yield dumps(record(ts=-0.0))
    yield dumps(record(ts="12"))  # a numeric string
    yield dumps(record(ts="soon"))
    yield dumps(record(ts=True))
    yield dumps(record(ts=None))
    yield dumps(record(ts=[1]))
    yield b'{"timestamp": NaN, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": Infinity, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": 1e400, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield dumps(record(length=-3))  # negative lengths
    yield dumps(record(out=-1))
    yield dumps(record(length=0, ids=[]))  # empty prompt, empty hash_ids: fine
    yield dumps(record(length=600, ids=[]))  # empty hash_ids for two blocks
    yield dumps(record(length=511, ids=[4]))  # one partial block: no hash, 0 prompt blocks
    yield dumps(record(length=1024, ids=[4]))  # one id for two blocks
    yield dumps(record(length=1024, ids=[4, 5, 6]))
    yield dumps(record(length=MAX_PLAUSIBLE_TOKENS + 1, ids=[]))
    yield dumps(record(length=1024.0, ids=[1, 2]))  # an integral float: accepted
    yield dumps(record(length=1024.5, ids=[1, 2]))
    yield dumps(record(length="1024", ids=[1, 2]))
    yield dumps(record(out=None))
    yield dumps(record(out=False))
    yield dumps(record(length=1024, ids=[1, "2"]))  # non-integer ids
    yield dumps(record(length=1024, ids=[1, 2.0]))
    yield dumps(record(length=1024, ids=[1, True]))
    yield dumps(record(length=1024, ids=[1, None]))
    yield dumps(record(length=1024, ids=[[1], 2]))
    yield dumps(record(length=1024, ids="1,2"))
    yield dumps(record(length=1024, ids={"a": 1}))
    yield dumps(record(length=1024, ids=[2**63 - 1, -(2**63)]))  # the int64 extremes
    yield dumps(record(length=1024, ids=[10**18, -(10**18)]))  # 19 digits, still int64
    yield dumps(record(length=1024, ids=[2**64, 1]))  # huge id in a full block
    yield dumps(record(length=1000, ids=[1, 10**30]))  # huge id in the partial block: dropped
    yield dumps(record(length=1024, ids=[-0, -7]))
    yield b'{"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [-0, 01]}'
    yield b'{"timestamp": 01, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1,]}'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1e3]}'
    yield b'{"timestamp": 1., "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]},'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]} {}'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]'
    yield b'{"timestamp":1,"input_length":512,"output_length":1,"hash_ids":[1]}'  # compact
    yield b' \t{ "timestamp" : 1 ,\t"input_length":512, "output_length" :1,"hash_ids":[ 1 ] } \r'
    yield b'{"hash_ids": [1, 2], "output_length": 3, "input_length": 700, "timestamp": 9}'
    yield b'{"timestamp": 1, "timestamp": 2, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1], "hash_ids": [1, 2]}'
    yield b'{"time\\u0073tamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1]}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": "a\\"b"}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": "caf\xc3\xa9"}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": "\xff"}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": "a\tb"}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "n": -1.5e-3, "t": true, "f": false, "z": null, "s": ""}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "nested": {"a": [1]}}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "l": [1, 2]}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": tru}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1], "x": -}'
    yield b'{"timestamp": 5, "input_length": 512, "output_length": 1}'  # missing hash_ids
    yield b'{"input_length": 512, "output_length": 1, "hash_ids": [1]}'  # missing timestamp
    yield b'{"timestamp": 5, "output_length": 1, "hash_ids": [1]}'
    yield b"{}"
    yield b"[1, 2]"
    yield b"42"
    yield b'"just a string"'
    yield b"null"
    yield b"{not json"
    yield b"[" * 100_000  # deeper than json can recurse
    yield b"\xff\xfe not utf-8"
    yield b""  # blank lines are not records
    yield b"   \t"
    yield b"\x0b\x0c\r"
    yield b"\x00"
    yield dumps(record(ts=5), indent=None, separators=(",", ":"))
    yield dumps(record(ts=6, length=40 * 512, ids=list(range(1000, 1040))))
    yield dumps(record(ts=7, length=19_000 * 512, ids=list(range(19_000))))  # a long line
    yield dumps(record(ts=7, length=20_000 * 512, ids=list(range(20_000))))  # too long a prompt
    yield b'{"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [-0, 5]}'
    yield dumps(record(ts=8)) + b"\r"  # CRLF line ending


def hostile_file(tmp_path: Path, name: str = "hostile.jsonl", **kwargs: Any) -> Path:
    # The first line is a clean record so the format is detected by content.
    return write_lines(tmp_path / name, list(hostile_lines()), **kwargs)


# ---------------------------------------------------------------------------------------------
# Reader level: the same rows and quarantine


@pytest.mark.parametrize("chunk", [source_module.CHUNK_BYTES, 4096, 61, 1])
def test_hostile_records_read_the_same_at_any_block_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Block boundaries anywhere (down to one byte a chunk) change nothing: line numbers,
    truncation of the last line and every quarantine reason and detail stay as they were."""
    monkeypatch.setattr(source_module, "CHUNK_BYTES", chunk)
    ctx = ReadContext(block_size=16, salt=b"salt", anchor=ANCHOR)
    result = assert_same_read(hostile_file(tmp_path), ctx)
    reasons = set(result.quarantine["reason"].to_list())
    assert reasons >= {
        "invalid_json",
        "invalid_utf8",
        "not_an_object",
        "missing",
        "negative",
        "absurd_value",
        "not_an_integer",
        "not_a_number",
        "not_finite",
        "timestamp_unit_mismatch",
        "implausible_timestamp",
        "not_a_list_of_integers",
        "length_mismatch",
        "malformed_record",
    }
    assert result.records_read == result.requests.height + result.quarantine.height


@pytest.mark.parametrize("last_newline", [True, False])
@pytest.mark.parametrize("last", [b"{not json", dumps(record(ts=99)), b"   "])
def test_the_last_line_with_and_without_its_newline(
    tmp_path: Path, last_newline: bool, last: bytes
) -> None:
    """An unterminated last line that is not JSON is truncated (terminated: invalid JSON); one
    that parses is a record either way; a blank one is nothing."""
    lines = [dumps(record()), dumps(record(ts=1)), last]
    path = write_lines(tmp_path / "t.jsonl", lines, last_newline=last_newline)
    assert_same_read(path, ReadContext(salt=b"s", anchor=ANCHOR))


@pytest.mark.parametrize(
    "anchor",
    [
        ANCHOR,
        datetime(2025, 3, 1, 12, 30, 0, 250, tzinfo=timezone(timedelta(hours=-5))),
        datetime(2026, 3, 28, 12, 0, tzinfo=ZoneInfo("Europe/Berlin")),  # DST the next day
        datetime(1995, 1, 1, tzinfo=UTC),  # early relative times are implausible
        datetime(2099, 12, 31, tzinfo=UTC),  # late ones too
        datetime(9999, 12, 1, tzinfo=UTC),  # anchor + offset overflows datetime
        datetime(2025, 3, 1),  # naive (library use): relative arrivals cannot be compared
    ],
    ids=["utc", "fixed-offset", "zoneinfo-dst", "1995", "2099", "9999", "naive"],
)
def test_relative_timestamps_after_any_anchor(tmp_path: Path, anchor: datetime) -> None:
    stamps = [0, 1, 500, 86_400_000 * 2, 999_999_999_999, 12.5, 0.0005, 10**12]
    lines = [dumps(record(ts=t)) for t in stamps]
    assert_same_read(
        write_lines(tmp_path / "r.jsonl", lines), ReadContext(salt=b"s", anchor=anchor)
    )


@pytest.mark.parametrize("salt", [b"", b"x", b"k" * 64, b"long salt " * 10])
def test_every_salt_hashes_alike(tmp_path: Path, salt: bytes) -> None:
    # The sample's first 2,000 records (every one of them is read whole by the ingest test).
    lines = SAMPLE.read_bytes().splitlines()[:2000]
    result = assert_same_read(
        write_lines(tmp_path / "first.jsonl", lines), ReadContext(salt=salt, anchor=ANCHOR)
    )
    assert result.requests.height == 2000 and result.requests["prefix_hashes"].list.len().sum() > 0


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_and_bom_files(tmp_path: Path, compress: str) -> None:
    data = b"\xef\xbb\xbf" + hostile_file(tmp_path).read_bytes()
    packed = gzip.compress(data) if compress == "gzip" else zstandard.compress(data)
    path = tmp_path / f"h.jsonl.{compress}"
    path.write_bytes(packed)
    assert_same_read(path, ReadContext(salt=b"s", anchor=ANCHOR))


def test_file_level_errors_are_one_line_naming_the_file(tmp_path: Path) -> None:
    packed = gzip.compress(SAMPLE.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    ctx = ReadContext(salt=b"s")
    with pytest.raises(InputFormatError, match=r"cut\.jsonl\.gz: truncated compressed file"):
        READER.read(SourceFile.of(cut), ctx)
    with pytest.raises(InputFormatError, match=r"nothere\.jsonl: file not found"):
        READER.read(SourceFile.of(tmp_path / "nothere.jsonl"), ctx)
    assert READER.read(SourceFile.of(write_lines(tmp_path / "e.jsonl", [])), ctx).records_read == 0


def test_mixed_blocks_of_clean_and_line_by_line_records_keep_line_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the scanner takes and rows the line-by-line path takes interleave by line."""
    monkeypatch.setattr(source_module, "CHUNK_BYTES", 300)
    lines = [
        dumps(record(ts=i, length=1024.0 if i % 3 else 1024, ids=[i, i + 1])) for i in range(40)
    ]
    result = assert_same_read(write_lines(tmp_path / "m.jsonl", lines), ReadContext(salt=b"s"))
    assert result.requests["source_line"].to_list() == list(range(1, 41))


# A record's fields drawn from what is valid and what is nearly so.
_NUMBERS = st.one_of(
    st.integers(-(10**3), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 511, 512, 513, 1024, 10**12, 1_767_225_600_000, MAX_PLAUSIBLE_TOKENS]),
)
_VALUES = st.one_of(_NUMBERS, st.none(), st.booleans(), st.text(max_size=4))
_IDS = st.one_of(
    st.lists(st.integers(-(2**64), 2**64), max_size=6),
    st.lists(st.one_of(st.integers(0, 9), st.floats(0, 9), st.booleans()), max_size=4),
    _VALUES,
)


# Strategies built once: a strategy made inside ``records`` is validated again at every draw,
# which cost more than reading the records.
_LENGTHS = st.one_of(st.integers(0, 3000), _VALUES)
_TIMESTAMPS = st.one_of(st.integers(0, 10**13), st.floats(0, 1e13), _VALUES)
_OUTPUT_LENGTHS = st.one_of(st.integers(0, 100), _VALUES)
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_EXTRA_FIELDS = ("extra", "ts", "x")
_DROPPED = st.lists(st.sampled_from(sorted(_FIELDS)), max_size=2)
_EXTRA_FIELD = st.sampled_from(_EXTRA_FIELDS)
# An order of every key a record may hold; a record keeps the order of those it has (an order
# of a subset drawn uniformly, as a permutation of the subset itself would be).
_KEY_ORDER = st.permutations(sorted(_FIELDS + _EXTRA_FIELDS))
_SPACINGS = st.sampled_from([(", ", ": "), (",", ":"), (" ,  ", " : ")])


@st.composite
def records(draw: st.DrawFn) -> bytes:
    length = draw(_LENGTHS)
    fits = isinstance(length, int) and not isinstance(length, bool) and 0 <= length < 10**5
    obj: dict[str, Any] = {
        "timestamp": draw(_TIMESTAMPS),
        "input_length": length,
        "output_length": draw(_OUTPUT_LENGTHS),
        # half the time the block ids a length of that many tokens has, else anything
        "hash_ids": list(range(-(-length // 512))) if fits and draw(st.booleans()) else draw(_IDS),
    }
    for key in draw(_DROPPED):
        obj.pop(key, None)
    if draw(st.booleans()):
        obj[draw(_EXTRA_FIELD)] = draw(_VALUES)
    ordered = {key: obj[key] for key in draw(_KEY_ORDER) if key in obj}
    spacing = draw(_SPACINGS)
    line = json.dumps(ordered, separators=spacing).encode()
    cut = draw(st.one_of(st.none(), st.integers(0, len(line))))
    return line if cut is None else line[:cut]


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(records(), min_size=1, max_size=12), st.booleans())
def test_any_mix_of_records_reads_the_same(
    tmp_path: Path, lines: list[bytes], last_newline: bool
) -> None:
    path = write_lines(tmp_path / "p.jsonl", lines, last_newline=last_newline)
    assert_same_read(path, ReadContext(salt=b"p", anchor=ANCHOR))


# ---------------------------------------------------------------------------------------------
# Command level: byte-identical outputs


def ingest_outputs(
    trace: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *, reference: bool
) -> dict[str, str]:
    return columnar_readers.ingest_outputs(
        MooncakeReader, trace, out, monkeypatch, reference=reference
    )


@pytest.mark.parametrize("trace", ["sample", "hostile", "hostile-unterminated", "generated"])
def test_ingest_writes_byte_identical_outputs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    trace: str,
) -> None:
    """Parquet parts, quarantine, summary and manifest: the same bytes either way."""
    if trace == "sample":
        path = SAMPLE
    elif trace == "generated":
        from perf.ingest import generate_mooncake_jsonl

        path = tmp_path / "generated.jsonl"
        generate_mooncake_jsonl(path, 3000, seed=5)
        # hostile records spread through a realistic trace, and its lines out of order
        lines = path.read_bytes().splitlines()
        rng = np.random.default_rng(3)
        bad = list(hostile_lines())
        for index in sorted(rng.choice(len(lines), len(bad), replace=False), reverse=True):
            lines.insert(int(index) + 1, bad.pop())
        lines[100], lines[200] = lines[200], lines[100]
        write_lines(path, lines)
    else:
        path = hostile_file(tmp_path, last_newline=trace == "hostile")
    columnar = ingest_outputs(path, tmp_path / "columnar", monkeypatch, reference=False)
    reference = ingest_outputs(path, tmp_path / "reference", monkeypatch, reference=True)
    capsys.readouterr()
    assert columnar == reference
    assert {"quarantine.parquet", "ingest_summary.json"} <= set(columnar)
    summary = json.loads((tmp_path / "columnar" / "ingest_summary.json").read_text())
    assert summary["records_read"] == summary["ingested"] + summary["quarantined"]
    if trace != "sample":
        assert summary["quarantined"] > 40 and summary["ingested"] > 10
