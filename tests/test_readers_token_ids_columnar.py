"""The columnar token-id reader writes exactly what the line-by-line reader writes.

``TokenIdsReader.read`` scans blocks of lines into flat arrays and chain-hashes the token ids
in a compiled kernel; the reference is the line-by-line path every JSON Lines reader has
(``JsonLinesReader.read``: ``json.loads`` and :meth:`TokenIdsReader.convert` per line), which
is how token-id traces were read before. On ``perf.workload``'s token-id form and on files full
of hostile records, ``enginefit ingest`` with either writes byte-identical canonical Parquet,
quarantine and summary, and the reader's rows and quarantine are equal frame for frame, at any
hash block size, salt and anchor, and with blocks of lines cut small enough that every record
boundary lands somewhere new.
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
from perf.workload import conversations, spec, write_token_ids
from pipeline.ingest.readers import ReadContext, ReadResult
from pipeline.ingest.readers.token_ids import TokenIdsReader
from pipeline.ingest.readers.token_ids_scan import FAST, PYTHON, scan_lines
from pipeline.schema import MAX_PLAUSIBLE_TOKENS
from tests import columnar_readers
from tests.columnar_readers import write_lines

ANCHOR = datetime(2025, 3, 1, tzinfo=UTC)
READER = TokenIdsReader()


def assert_same_read(path: Path, ctx: ReadContext) -> ReadResult:
    return columnar_readers.assert_same_read(READER, path, ctx)


def record(ts: Any = 0, prompt: Any = None, output: Any = None, **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "ts": ts,
        "prompt_token_ids": list(range(100, 140)) if prompt is None else prompt,
    }
    if output is not None:
        obj["output_token_ids"] = output
    return obj | fields


def dumps(obj: Any, **kwargs: Any) -> bytes:
    return json.dumps(obj, **kwargs).encode()


GOOD = b'"ts": 5, "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]'


def with_good(extra: bytes) -> bytes:
    """A clean record with ``extra`` (``"key": value`` text) after its fields."""
    return b"{" + GOOD + b", " + extra + b"}"


def hostile_lines() -> Iterator[bytes]:
    """Every kind of record a token-id file may hold, good and bad, one per line."""
    yield dumps(record(output=[7, 8, 9]))
    yield dumps(record(ts=3.25, session_id="s1", turn=0, output=list(range(20))))
    yield dumps(record(ts=1_767_225_600))  # epoch seconds: absolute
    yield dumps(record(ts=1_767_225_600.123456))
    yield dumps(record(ts=1_767_225_600_000))  # epoch ms: unit mismatch
    yield dumps(record(ts=1_767_225_600_000_000))
    yield dumps(record(ts=10**40))
    yield dumps(record(ts=99_999_999_999))  # past the unit bound
    yield dumps(record(ts=4_200_000_000))  # 2103: implausible
    yield dumps(record(ts=999_999_999))  # just below the epoch bound: relative
    yield dumps(record(ts=1_000_000_000))
    yield dumps(record(ts=0.0000005))
    yield dumps(record(ts=0.0000015))
    yield dumps(record(ts=-5))
    yield dumps(record(ts=-0.0))
    yield dumps(record(ts="12"))
    yield dumps(record(ts="2025-03-01T10:00:00Z"))  # ISO strings are accepted
    yield dumps(record(ts="soon"))
    yield dumps(record(ts=True))
    yield dumps(record(ts=None))
    yield dumps(record(ts=None, timestamp=7))  # the second spelling
    yield dumps(record(ts=4, timestamp="ignored"))
    yield dumps(record(ts=4, timestamp=[1]))
    yield dumps({k: v for k, v in record(timestamp=9).items() if k != "ts"})
    yield dumps({k: v for k, v in record().items() if k != "ts"})
    yield dumps(record(ts=[1]))
    yield dumps(record(ts=1234567890123456))  # 16 digits
    yield b'{"ts": 1e2, "prompt_token_ids": [1]}'
    yield b'{"ts": 2.5E-3, "prompt_token_ids": [1]}'
    yield b'{"ts": NaN, "prompt_token_ids": [1]}'
    yield b'{"ts": Infinity, "prompt_token_ids": [1]}'
    yield b'{"ts": 1e400, "prompt_token_ids": [1]}'
    yield b'{"ts": 01, "prompt_token_ids": [1]}'
    yield b'{"ts": 1., "prompt_token_ids": [1]}'
    # token ids
    yield dumps(record(prompt=[]))
    yield dumps(record(prompt=[], output=[]))
    yield dumps(record(prompt=list(range(15))))
    yield dumps(record(prompt=list(range(16))))
    yield dumps(record(prompt=list(range(17)), output=list(range(15))))
    yield dumps(record(prompt=[0, 2**32 - 1] * 8))
    yield dumps(record(prompt=[2**32] + [1] * 20))
    yield dumps(record(prompt=[1] * 20 + [2**64]))
    yield dumps(record(prompt=[10**30]))
    yield dumps(record(prompt=[-1, 2]))
    yield dumps(record(prompt=[1, 2.0]))
    yield dumps(record(prompt=[1, True]))
    yield dumps(record(prompt=[1, None]))
    yield dumps(record(prompt=[1, "2"]))
    yield dumps(record(prompt=[[1], 2]))
    yield dumps(record(prompt="1,2"))
    yield dumps(record(prompt={"a": 1}))
    yield dumps(record(prompt=None))
    yield dumps(record(prompt=7))
    yield dumps(record(output=[1, -2]))
    yield dumps(record(output="x"))
    yield dumps(record(output=[4294967295, 0]))
    yield b'{"ts": 1, "prompt_token_ids": [-0, 1]}'
    yield b'{"ts": 1, "prompt_token_ids": [01, 1]}'
    yield b'{"ts": 1, "prompt_token_ids": [1e3]}'
    yield b'{"ts": 1, "prompt_token_ids": [1.5]}'
    yield b'{"ts": 1, "prompt_token_ids": [1,]}'
    yield b'{"ts": 1, "prompt_token_ids": [,1]}'
    yield b'{"ts": 1, "prompt_token_ids": [1 2]}'
    yield b'{"ts": 1, "prompt_token_ids": [ 1 ,2 ,\t3 ]}'
    yield b'{"ts": 1, "prompt_token_ids": [0000000001]}'
    yield b'{"ts": 1, "prompt_token_ids": [4294967296]}'
    yield b'{"ts": 1, "prompt_token_ids": [99999999999999999999999999]}'
    yield b'{"ts": 1, "prompt_token_ids": [18446744073709551617]}'  # wraps to 1 in 64 bits
    # output counts
    yield dumps(record(output_tokens=3))
    yield dumps(record(output_tokens=None))
    yield dumps(record(output=[1, 2, 3], output_tokens=3))
    yield dumps(record(output=[1, 2, 3], output_tokens=4))  # length_mismatch
    yield dumps(record(output=None, output_tokens=4))
    yield dumps(record(output=[1, 2], output_tokens=None))
    yield dumps(record(output_tokens=3.0))
    yield dumps(record(output_tokens=3.5))
    yield dumps(record(output_tokens="3"))
    yield dumps(record(output_tokens=-1))
    yield dumps(record(output_tokens=True))
    yield dumps(record(output_tokens=MAX_PLAUSIBLE_TOKENS))
    yield dumps(record(output_tokens=MAX_PLAUSIBLE_TOKENS + 1))
    yield dumps(record(output_tokens=10**20))
    yield dumps(record(output_tokens=[3]))
    # turn
    for turn in (0, 5, None, -1, 1.0, "2", True, 2**31, MAX_PLAUSIBLE_TOKENS, [1]):
        yield dumps(record(turn=turn))
    # durations
    for key in ("duration_s", "ttft_s"):
        for value in (1, 1.5, 0, 2e-3, None, -1, -0.0, "1.5", True, [1], 10**20, 10**15):
            yield dumps(record(**{key: value}))
        yield with_good(b'"' + key.encode() + b'": 1e400')
        yield with_good(b'"' + key.encode() + b'": 1' + b"0" * 400)
        yield with_good(b'"' + key.encode() + b'": 12345678901234567')
        yield with_good(b'"' + key.encode() + b'": 1.0e+2')
    yield dumps(record(duration_s=2.5, ttft_s=0.125))
    # text fields: sessions, tenants, model, request ids
    for key in ("session_id", "session", "conversation_id", "conversation", "thread_id"):
        yield dumps(record(**{key: f"{key}-x"}))
    for key in ("tenant", "tenant_id", "user", "user_id"):
        yield dumps(record(**{key: f"{key}-x"}))
    yield dumps(record(session_id=None, session="second"))
    yield dumps(record(session="second", session_id="first"))  # preference, not line order
    yield dumps(record(session_id="first", session="second"))
    yield dumps(record(session_id="first", session=None, thread_id=1))
    yield dumps(record(conversation="c", thread_id="t", session_id=None))
    yield dumps(record(tenant="t", user_id="u"))
    yield dumps(record(request_id="r", id="i"))
    yield dumps(record(user_id="u", tenant="t"))
    yield dumps(record(user_id=None, user=None, tenant_id=3))
    yield dumps(record(session_id=12))
    yield dumps(record(session_id=0))
    yield dumps(record(session_id=-3))
    yield dumps(record(session_id=1.5))
    yield dumps(record(session_id=True))
    yield dumps(record(session_id=10**20))  # 21 digits: str() all the same
    yield dumps(record(session_id=["a"]))
    yield dumps(record(session_id={"a": 1}))
    yield dumps(record(session_id=""))
    yield dumps(record(session_id="café"))  # escaped by json.dumps
    yield dumps(record(session_id="café"), ensure_ascii=False)  # raw UTF-8
    yield dumps(record(session_id="😀"), ensure_ascii=False)
    yield dumps(record(session_id='a"b\\c/d'))
    yield dumps(record(session_id="tab\there"))
    yield with_good(b'"session_id": "caf\xc3\xa9"')
    yield with_good(b'"session_id": "\xff"')
    yield with_good(b'"session_id": "\xed\xa0\x80"')  # a UTF-8-encoded surrogate
    yield with_good(b'"session_id": "\\ud800"')  # a lone surrogate escape: quarantined
    yield with_good(b'"session_id": "a\tb"')  # a raw control character: invalid JSON
    yield with_good(b'"session_id": "a\x7fb"')  # DEL is allowed
    yield with_good(b'"session_id": "\\u0041"')
    yield with_good(b'"session_id": 007')
    yield with_good(b'"session_id": 1e3')
    yield dumps(record(model="m-1"))
    yield dumps(record(model=5))
    yield dumps(record(model=False))
    yield dumps(record(model=None))
    yield dumps(record(request_id="r-1"))
    yield dumps(record(request_id=None, id="second"))
    yield dumps(record(id=42))
    yield dumps(record(id=0))
    yield dumps(record(request_id=""))
    yield dumps(record(request_id=[1]))
    yield dumps(record(request_id=3.0))
    yield dumps(
        record(
            ts=12.5,
            session_id="s",
            turn=3,
            tenant="t",
            model="m",
            request_id="r",
            duration_s=1.25,
            ttft_s=0.5,
            output=list(range(33)),
            output_tokens=33,
        )
    )
    # other keys
    yield with_good(b'"extra": "x", "n": -1.5e-3, "t": true, "f": false, "z": null, "s": ""')
    yield with_good(b'"nested": {"a": [1]}')
    yield with_good(b'"list": [1, 2]')
    yield with_good(b'"x": tru')
    yield with_good(b'"x": -')
    yield with_good(b'"x": "a\\"b"')
    yield with_good(b'"x": "\xff"')
    yield with_good(b'"prompt": "some text"')
    # repeated and escaped keys
    yield b'{"ts": 1, "ts": 2, "prompt_token_ids": [1]}'
    yield b'{"ts": 1, "prompt_token_ids": [1], "prompt_token_ids": [1, 2]}'
    yield b'{"ts": 1, "prompt_token_ids": [1], "session_id": "a", "session_id": "b"}'
    yield b'{"ts": 1, "prompt_token_ids": [1], "x": 1, "x": 2}'
    yield b'{"t\\u0073": 5, "prompt_token_ids": [1]}'
    yield b'{"ts": 5, "prompt_token_id\\u0073": [1]}'
    # structure
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
    yield b"{" + GOOD + b"},"
    yield b"{" + GOOD + b"} {}"
    yield b"{" + GOOD
    yield b'{"ts":1,"prompt_token_ids":[1,2,3],"output_tokens":2}'  # compact
    yield b' \t{ "ts" : 1 ,\t"prompt_token_ids":[ 1 ] } \r'
    yield b'{"prompt_token_ids": [3, 4], "output_token_ids": [5], "ts": 9}'
    yield dumps(record(ts=6, prompt=list(range(40_000))))  # a long line
    yield dumps(record(ts=8)) + b"\r"  # CRLF line ending


def hostile_file(tmp_path: Path, name: str = "hostile.jsonl", **kwargs: Any) -> Path:
    # The first line is a clean record so the format is detected by content.
    return write_lines(tmp_path / name, list(hostile_lines()), **kwargs)


def generated_file(tmp_path: Path, *, requests: int = 400, **settings_: Any) -> Path:
    sessions = settings_.pop("sessions", False)
    path = tmp_path / "generated.jsonl"
    write_token_ids(
        conversations(spec(requests, "short", seed=4, **settings_)), path, sessions=sessions
    )
    return path


# ---------------------------------------------------------------------------------------------
# The scanner claims what it is sure of


def test_the_scanner_takes_clean_records_and_leaves_the_rest_to_json() -> None:
    """Clean records are scanned; the doubtful ones are marked for the line-by-line path
    (where the hostile tests below check they come out alike)."""
    clean = [
        dumps(record(output=[7, 8, 9])),
        dumps(record(session_id=12, turn=None, model=None, output_tokens=4)),
        b' \t{ "ts" : 1 ,\t"prompt_token_ids":[ 1 ] } \r',
    ]
    doubtful = [
        dumps(record(session_id="café")),
        dumps(record(output=[1, 2, 3], output_tokens=4)),
        dumps(record(ts=-5)),
        dumps(record(prompt=[2**32])),
        b'{"ts": 1, "ts": 2, "prompt_token_ids": [1]}',
        with_good(b'"nested": {"a": [1]}'),
    ]
    kinds = scan_lines(b"\n".join(clean + doubtful) + b"\n")[1]
    assert kinds.tolist() == [FAST] * len(clean) + [PYTHON] * len(doubtful)


# ---------------------------------------------------------------------------------------------
# Reader level: the same rows and quarantine


@pytest.mark.parametrize("chunk", [source_module.CHUNK_BYTES, 4096, 61, 1])
def test_hostile_records_read_the_same_at_any_block_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Blocks of lines cut anywhere (down to one byte a chunk) change nothing: line numbers,
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
        "not_a_string",
        "not_a_list",
        "invalid_token_id",
        "length_mismatch",
        "timestamp_unit_mismatch",
        "implausible_timestamp",
        "not_a_timestamp",
        "malformed_record",
    }
    assert result.records_read == result.requests.height + result.quarantine.height
    assert result.requests.height > 100 and result.quarantine.height > 80


@pytest.fixture(scope="module")
def sessions_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 requests of ``perf.workload``'s token-id form in sessions, written once: the tests
    that read it only vary how it is hashed."""
    return generated_file(tmp_path_factory.mktemp("sessions"), requests=150, sessions=True)


@pytest.mark.parametrize("block_size", [1, 3, 16, 29, 30, 64, 256])
@pytest.mark.parametrize("salt", [b"", b"x", b"k" * 64, b"long salt " * 10])
def test_every_hash_block_size_and_salt_hashes_alike(
    sessions_file: Path, block_size: int, salt: bytes
) -> None:
    """Messages of one BLAKE2b block (up to 29 tokens) and of several; no key, short and long
    keys (folded)."""
    result = assert_same_read(
        sessions_file, ReadContext(block_size=block_size, salt=salt, anchor=ANCHOR)
    )
    assert result.requests["prefix_hashes"].list.len().sum() > 0


@pytest.mark.parametrize(
    "settings_",
    [{}, {"sessions": True}, {"sessions": True, "tenants": 3, "models": 2}, {"tenants": 2}],
    ids=["plain", "sessions", "sessions-tenants-models", "tenants"],
)
def test_the_generated_token_id_form_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings_: dict[str, Any]
) -> None:
    """``perf.workload``'s token-id form, all of it scanned (nothing left to ``json``), also
    with blocks of lines small enough that records straddle every block boundary."""
    # 100 requests (600 kB): blocks of 1,000 bytes cost the scanner a frame each.
    path = generated_file(tmp_path, requests=100, **settings_)
    ctx = ReadContext(block_size=16, salt=b"g", anchor=ANCHOR)
    result = assert_same_read(path, ctx)
    assert result.quarantine.height == 0 and result.requests.height == 100
    kinds = scan_lines(path.read_bytes())[1]
    assert (kinds == FAST).all()
    monkeypatch.setattr(source_module, "CHUNK_BYTES", 1000)
    assert_same_read(path, ctx)


@pytest.mark.parametrize("last_newline", [True, False])
@pytest.mark.parametrize("last", [b"{not json", dumps(record(ts=99)), b"   "])
def test_the_last_line_with_and_without_its_newline(
    tmp_path: Path, last_newline: bool, last: bytes
) -> None:
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
        datetime(2025, 3, 1),  # naive (library use)
    ],
    ids=["utc", "fixed-offset", "zoneinfo-dst", "1995", "2099", "9999", "naive"],
)
def test_relative_timestamps_after_any_anchor(tmp_path: Path, anchor: datetime) -> None:
    stamps = [0, 1, 0.5, 86_400 * 2, 999_999_999, 12.000001, 0.0000005, 10**9, 1.5e9]
    lines = [dumps(record(ts=t)) for t in stamps]
    assert_same_read(
        write_lines(tmp_path / "r.jsonl", lines), ReadContext(salt=b"s", anchor=anchor)
    )


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_and_bom_files(tmp_path: Path, compress: str) -> None:
    data = b"\xef\xbb\xbf" + hostile_file(tmp_path).read_bytes()
    data += generated_file(tmp_path, requests=100, sessions=True).read_bytes()
    packed = gzip.compress(data) if compress == "gzip" else zstandard.compress(data)
    path = tmp_path / f"h.jsonl.{compress}"
    path.write_bytes(packed)
    assert_same_read(path, ReadContext(salt=b"s", anchor=ANCHOR))


def test_mixed_blocks_of_clean_and_line_by_line_records_keep_line_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the scanner takes and rows the line-by-line path takes interleave by line."""
    monkeypatch.setattr(source_module, "CHUNK_BYTES", 300)
    lines = [
        dumps(record(ts=i, prompt=list(range(i, i + 20)), session_id="é" if i % 3 else "e"))
        for i in range(40)
    ]
    result = assert_same_read(write_lines(tmp_path / "m.jsonl", lines), ReadContext(salt=b"s"))
    assert result.requests["source_line"].to_list() == list(range(1, 41))


# A record's fields drawn from what is valid and what is nearly so.
_NUMBERS = st.one_of(
    st.integers(-(10**3), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 15, 16, 17, 2**32 - 1, 2**32, 10**9, 1_767_225_600, MAX_PLAUSIBLE_TOKENS]),
)
_VALUES = st.one_of(_NUMBERS, st.none(), st.booleans(), st.text(max_size=4))
_IDS = st.one_of(
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(st.integers(-(2**33), 2**65), max_size=6),
    st.lists(st.one_of(st.integers(0, 9), st.floats(0, 9), st.booleans()), max_size=4),
    _VALUES,
)


# Strategies built once: a strategy made inside ``records`` is validated again at every draw,
# which cost more than reading the records.
_TIMESTAMPS = st.one_of(st.integers(0, 10**10), st.floats(0, 1e10), _VALUES)
_OUTPUT_TOKENS = st.one_of(st.integers(0, 40), _VALUES)
_TURNS = st.one_of(st.integers(0, 9), _VALUES)
_DURATIONS = st.one_of(st.floats(0, 100), _VALUES)
_FIELDS = (
    "ts",
    "prompt_token_ids",
    "output_token_ids",
    "output_tokens",
    "session_id",
    "turn",
    "duration_s",
)
_EXTRA_FIELDS = ("extra", "timestamp", "user", "id", "model")
_DROPPED = st.lists(st.sampled_from(sorted(_FIELDS)), max_size=5)
_EXTRA_FIELD = st.sampled_from(_EXTRA_FIELDS)
# An order of every key a record may hold; a record keeps the order of those it has (an order
# of a subset drawn uniformly, as a permutation of the subset itself would be).
_KEY_ORDER = st.permutations(sorted(_FIELDS + _EXTRA_FIELDS))
_SPACINGS = st.sampled_from([(", ", ": "), (",", ":"), (" ,  ", " : ")])


@st.composite
def records(draw: st.DrawFn) -> bytes:
    prompt = draw(_IDS)
    obj: dict[str, Any] = {
        "ts": draw(_TIMESTAMPS),
        "prompt_token_ids": prompt,
        "output_token_ids": draw(_IDS),
        "output_tokens": draw(_OUTPUT_TOKENS),
        "session_id": draw(_VALUES),
        "turn": draw(_TURNS),
        "duration_s": draw(_DURATIONS),
    }
    for key in draw(_DROPPED):
        obj.pop(key, None)
    if draw(st.booleans()):
        obj[draw(_EXTRA_FIELD)] = draw(_VALUES)
    ordered = {key: obj[key] for key in draw(_KEY_ORDER) if key in obj}
    spacing = draw(_SPACINGS)
    line = json.dumps(ordered, separators=spacing, ensure_ascii=draw(st.booleans())).encode()
    cut = draw(st.one_of(st.none(), st.integers(0, len(line))))
    return line if cut is None else line[:cut]


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(records(), min_size=1, max_size=12), st.booleans(), st.sampled_from([1, 4, 16]))
def test_any_mix_of_records_reads_the_same(
    tmp_path: Path, lines: list[bytes], last_newline: bool, block_size: int
) -> None:
    path = write_lines(tmp_path / "p.jsonl", lines, last_newline=last_newline)
    assert_same_read(path, ReadContext(block_size=block_size, salt=b"p", anchor=ANCHOR))


# ---------------------------------------------------------------------------------------------
# Command level: byte-identical outputs


def ingest_outputs(
    trace: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *, reference: bool
) -> dict[str, str]:
    return columnar_readers.ingest_outputs(
        TokenIdsReader, trace, out, monkeypatch, reference=reference
    )


@pytest.mark.parametrize(
    "trace", ["generated", "generated-tenants", "hostile", "hostile-unterminated", "mixed"]
)
def test_ingest_writes_byte_identical_outputs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    trace: str,
) -> None:
    """Parquet parts, quarantine, summary and manifest: the same bytes either way."""
    if trace == "generated":
        path = generated_file(tmp_path, requests=1500)
    elif trace == "generated-tenants":
        path = generated_file(tmp_path, requests=1500, sessions=True, tenants=4, models=3)
    elif trace == "mixed":
        # hostile records spread through a realistic trace, and its lines out of order
        path = generated_file(tmp_path, requests=1500, sessions=True)
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
    if trace.startswith("generated"):
        assert (summary["ingested"], summary["quarantined"]) == (1500, 0)
    else:
        assert summary["quarantined"] > 80 and summary["ingested"] > 100
