"""Bad input, reader by reader: every record is ingested or quarantined with file, line, field, reason.

Covers: undetectable format, empty file, truncated last line, invalid
UTF-8 or JSON, missing / negative / absurd token counts, millisecond-vs-second mix-ups,
unsorted or duplicate timestamps, duplicate request ids. Readers keep file order and every
row; sorting and duplicate ids are the ingest layer's job (tested at the end through
``pipeline.ingest.ingest_paths``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import InputFormatError
from pipeline.ingest.compute import ingest_paths
from pipeline.ingest.present import summary_text
from pipeline.ingest.readers import FORMAT_NAMES, ReadContext, ReadResult, SourceFile, detect_reader
from pipeline.schema import MAX_PLAUSIBLE_TOKENS

ANCHOR = datetime(2025, 3, 1, tzinfo=UTC)
CTX = ReadContext(block_size=4, salt=b"s", anchor=ANCHOR)

# One valid record per JSON Lines format (fields the tests below corrupt are named explicitly).
GOOD: dict[str, dict[str, Any]] = {
    "mooncake": {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
    "tracelab": {
        "provider": "codex",
        "session_id": "codex:s",
        "round_index": 0,
        "model": "gpt-5.4",
        "input_tokens_total": 100,
        "prefix_tokens": 64,
        "output_tokens": 9,
        "timing_events": [
            {"event_type": "user_message", "timestamp": "2026-03-21T10:05:59.328Z"},
            {"event_type": "text", "timestamp": "2026-03-21T10:06:00.000Z"},
        ],
    },
    "token-ids": {"ts": 5, "prompt_token_ids": [1, 2, 3, 4, 5], "output_tokens": 2},
    "openai-chat": {
        "created": 1767225600,
        "request": {"messages": [{"role": "user", "content": "hello there"}]},
        "response": {
            "choices": [{"message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 2},
        },
    },
    "prompt-text": {"ts": 5, "prompt": "hello there", "output_tokens": 2, "duration_s": 1.0},
}
JSON_FORMATS = sorted(GOOD)
CSV_GOOD = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.9799600,4808,10"),
    "burstgpt": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        "5,ChatGPT,472,18,490,Conversation log",
    ),
}


def jline(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def write(tmp_path: Path, data: bytes, name: str = "trace.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def read(path: Path) -> tuple[str, ReadResult]:
    source = SourceFile.of(path)
    reader = detect_reader(source)
    return reader.name, reader.read(source, CTX)


def reasons(result: ReadResult) -> list[tuple[int, str, str]]:
    q = result.quarantine.sort("source_line")
    return list(zip(q["source_line"], q["field"], q["reason"], strict=True))


def check_quarantine_complete(result: ReadResult, path: Path) -> None:
    q = result.quarantine
    assert q.null_count().sum_horizontal().item() == 0
    assert (q["source_file"] == str(path)).all()
    assert result.records_read == result.requests.height + q.height


def with_path(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``obj`` with ``dotted`` set (``value is DELETE`` removes the key)."""
    copy: dict[str, Any] = json.loads(json.dumps(obj))
    target: Any = copy
    *parents, last = dotted.split(".")
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return copy


DELETE = object()

# ---------------------------------------------------------------------------------------------
# Whole-file problems: clean errors naming the file


def test_undetectable_format_names_file_and_formats(tmp_path: Path) -> None:
    path = write(tmp_path, b"just some words\nand more\n")
    with pytest.raises(InputFormatError) as info:
        read(path)
    message = str(info.value)
    assert str(path) in message
    assert all(name in message for name in FORMAT_NAMES)


def test_json_of_unknown_shape_is_undetectable(tmp_path: Path) -> None:
    path = write(tmp_path, jline({"when": 1, "text": "x"}))
    with pytest.raises(InputFormatError, match="unrecognised trace format"):
        read(path)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path, content)
    with pytest.raises(InputFormatError, match="empty") as info:
        read(path)
    assert str(path) in str(info.value)


def test_missing_file_is_a_clean_error(tmp_path: Path) -> None:
    with pytest.raises(InputFormatError, match="not found"):
        read(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("fmt", sorted(CSV_GOOD))
def test_csv_header_only_reads_nothing(tmp_path: Path, fmt: str) -> None:
    header, _ = CSV_GOOD[fmt]
    name, result = read(write(tmp_path, header.encode() + b"\n"))
    assert name == fmt and result.records_read == 0 and result.requests.height == 0


# ---------------------------------------------------------------------------------------------
# Line-level damage in every JSON Lines format


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_json_line_damage(tmp_path: Path, fmt: str) -> None:
    good = jline(GOOD[fmt])
    data = (
        good  # 1
        + b"\n"  # 2: blank, not a record
        + good[:-1].replace(b"{", b"{\xff\xfe", 1)
        + b"\n"  # 3: invalid UTF-8
        + b'{"oops": \n'  # 4: invalid JSON
        + b"[1, 2, 3]\n"  # 5: JSON, not an object
        + good  # 6
        + good[: len(good) // 2]  # 7: truncated last line (no newline)
    )
    path = write(tmp_path, data)
    name, result = read(path)
    assert name == fmt
    assert result.records_read == 6 and result.requests.height == 2
    assert result.requests["source_line"].to_list() == [1, 6]
    assert reasons(result) == [
        (3, "<line>", "invalid_utf8"),
        (4, "<line>", "invalid_json"),
        (5, "<line>", "not_an_object"),
        (7, "<line>", "truncated_last_line"),
    ]
    check_quarantine_complete(result, path)


# Per format: the token-count field to corrupt (dotted path into the record) and the field name
# the quarantine must report.
COUNT_FIELDS = {
    "mooncake": ("output_length", "output_length"),
    "tracelab": ("input_tokens_total", "input_tokens_total"),
    "token-ids": ("output_tokens", "output_tokens"),
    "openai-chat": ("response.usage.prompt_tokens", "usage.prompt_tokens"),
    "prompt-text": ("output_tokens", "output_tokens"),
}


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-3, "negative"),
        (MAX_PLAUSIBLE_TOKENS + 1, "absurd_value"),
        (10**30, "absurd_value"),
        (2.5, "not_an_integer"),
        ("many", "not_an_integer"),
        (True, "not_an_integer"),
        ([1], "not_an_integer"),
    ],
)
def test_bad_token_counts(tmp_path: Path, fmt: str, value: Any, reason: str) -> None:
    dotted, field = COUNT_FIELDS[fmt]
    path = write(tmp_path, jline(GOOD[fmt]) + jline(with_path(GOOD[fmt], dotted, value)))
    _, result = read(path)
    assert result.requests.height == 1
    assert reasons(result) == [(2, field, reason)]
    check_quarantine_complete(result, path)


REQUIRED = {
    "mooncake": ("hash_ids", "hash_ids"),
    "tracelab": ("input_tokens_total", "input_tokens_total"),
    "token-ids": ("prompt_token_ids", "prompt_token_ids"),
    "openai-chat": ("request.messages", "messages"),
    "prompt-text": ("prompt", "prompt"),
}


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_missing_required_field(tmp_path: Path, fmt: str) -> None:
    dotted, field = REQUIRED[fmt]
    path = write(tmp_path, jline(GOOD[fmt]) + jline(with_path(GOOD[fmt], dotted, DELETE)))
    _, result = read(path)
    assert reasons(result) == [(2, field, "missing")]


@pytest.mark.parametrize(
    ("fmt", "dotted", "field"),
    [
        ("token-ids", "ts", "ts"),
        ("prompt-text", "ts", "ts"),
        ("openai-chat", "created", "created"),
    ],
)
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (1_767_225_600_000, "timestamp_unit_mismatch"),  # ms where seconds belong
        (1_767_225_600_000_000, "timestamp_unit_mismatch"),  # µs
        (-1, "negative"),
        ("yesterday", "not_a_timestamp"),
        ("3000-01-01T00:00:00Z", "implausible_timestamp"),
    ],
)
def test_timestamp_units(
    tmp_path: Path, fmt: str, dotted: str, field: str, value: Any, reason: str
) -> None:
    path = write(tmp_path, jline(GOOD[fmt]) + jline(with_path(GOOD[fmt], dotted, value)))
    _, result = read(path)
    assert reasons(result) == [(2, field, reason)]


def test_seconds_epoch_relative_and_iso_all_accepted(tmp_path: Path) -> None:
    lines = [
        {"ts": t, "prompt_token_ids": [1]} for t in (1_767_225_600, 12.5, "2026-01-01T00:00:00Z")
    ]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert result.requests["arrival"].to_list() == [
        datetime(2026, 1, 1, tzinfo=UTC),
        ANCHOR + timedelta(seconds=12.5),
        datetime(2026, 1, 1, tzinfo=UTC),
    ]


def test_burstgpt_ms_timestamp_is_a_unit_mismatch(tmp_path: Path) -> None:
    header, row = CSV_GOOD["burstgpt"]
    bad = row.replace("5,", "1767225600000,", 1)
    path = write(tmp_path, f"{header}\n{row}\n{bad}\n".encode())
    _, result = read(path)
    assert reasons(result) == [(3, "Timestamp", "timestamp_unit_mismatch")]


def test_tracelab_specific_problems(tmp_path: Path) -> None:
    good = GOOD["tracelab"]
    lines = [
        with_path(good, "prefix_tokens", 101),  # more cached than prompt
        with_path(good, "timing_events", []),
        with_path(good, "timing_events", [{"event_type": "text", "timestamp": "soon"}]),
        with_path(good, "session_id", DELETE),
        with_path(good, "timing_events", [{"timestamp": "2026-03-21T10:05:59Z"}]),
    ]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert reasons(result) == [
        (1, "prefix_tokens", "exceeds_prompt_tokens"),
        (2, "timing_events", "missing"),
        (3, "timing_events[0].timestamp", "not_a_timestamp"),
        (4, "session_id", "missing"),
        (5, "timing_events[0].event_type", "missing"),
    ]


def test_openai_chat_malformed_messages(tmp_path: Path) -> None:
    good = GOOD["openai-chat"]
    lines = [
        good,
        with_path(good, "request.messages", "hello"),
        with_path(good, "request.messages", [{"content": "no role"}]),
        with_path(good, "request.messages", [{"role": "user", "content": 42}]),
        with_path(
            good, "request.messages", [{"role": "user", "content": [{"type": "text", "text": 1}]}]
        ),
        with_path(good, "response.choices", {"a": 1}),
        with_path(good, "response.usage", [1]),
        with_path(good, "created", DELETE),
    ]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert reasons(result) == [
        (2, "messages", "not_a_list"),
        (3, "messages[0].role", "missing"),
        (4, "messages[0].content", "not_a_string_or_list"),
        (5, "messages[0].content.text", "not_a_string"),
        (6, "choices", "not_a_list"),
        (7, "usage", "not_an_object"),
        (8, "timestamp", "missing"),
    ]


def test_token_ids_bad_ids(tmp_path: Path) -> None:
    good = GOOD["token-ids"]
    lines = [
        with_path(good, "prompt_token_ids", [1, -2]),
        with_path(good, "prompt_token_ids", [1, 2**32]),
        with_path(good, "prompt_token_ids", [1, "2"]),
        with_path(good, "prompt_token_ids", [1.5]),
        with_path(good, "prompt_token_ids", "1 2 3"),
        with_path(good, "output_token_ids", [[1]]),
    ]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert [r[1:] for r in reasons(result)] == [
        ("prompt_token_ids", "invalid_token_id"),
        ("prompt_token_ids", "invalid_token_id"),
        ("prompt_token_ids", "invalid_token_id"),
        ("prompt_token_ids", "invalid_token_id"),
        ("prompt_token_ids", "not_a_list"),
        ("output_token_ids", "invalid_token_id"),
    ]


@pytest.mark.parametrize("fmt", sorted(CSV_GOOD))
def test_csv_damage(tmp_path: Path, fmt: str) -> None:
    header, row = CSV_GOOD[fmt]
    first, *rest = row.split(",")
    data = (
        f"{header}\n{row}\n".encode()  # 2
        + row.encode()
        + b",extra\n"  # 3: wrong field count
        + b"\xff"
        + row.encode()
        + b"\n"  # 4: invalid UTF-8
        + ",".join([first, *[r if not r.isdigit() else "-1" for r in rest]]).encode()
        + b"\n"  # 5
        + b"\n"  # 6: blank
        + row.encode()[: len(row) // 2]  # 7: truncated last line
    )
    path = write(tmp_path, data)
    name, result = read(path)
    assert name == fmt
    assert result.requests["source_line"].to_list() == [2]
    got = reasons(result)
    assert [line for line, *_ in got] == [3, 4, 5, 7]
    assert got[0][2] == "wrong_field_count" and got[1][2] == "invalid_utf8"
    assert got[2][2] == "negative"
    check_quarantine_complete(result, path)


# ---------------------------------------------------------------------------------------------
# Order and duplicates: readers keep everything in file order; ingest sorts and reports


@pytest.mark.parametrize("fmt", ["token-ids", "prompt-text"])
def test_reader_keeps_unsorted_and_duplicate_timestamps(tmp_path: Path, fmt: str) -> None:
    stamps = [30, 10, 10, 20]
    lines = [with_path(GOOD[fmt], "ts", t) for t in stamps]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert result.requests["arrival"].to_list() == [ANCHOR + timedelta(seconds=t) for t in stamps]


def test_reader_keeps_duplicate_request_ids(tmp_path: Path) -> None:
    lines = [with_path(GOOD["prompt-text"], "request_id", "same") for _ in range(2)]
    _, result = read(write(tmp_path, b"".join(jline(x) for x in lines)))
    assert result.requests["request_id"].to_list() == ["same", "same"]


def test_ingest_sorts_reports_and_quarantines_duplicates(tmp_path: Path) -> None:
    stamps = [30, 10, 10, 20, 40]
    ids = ["a", "b", "c", "a", "d"]
    lines = [
        with_path(with_path(GOOD["token-ids"], "ts", t), "request_id", i)
        for t, i in zip(stamps, ids, strict=True)
    ]
    path = write(tmp_path, b"".join(jline(x) for x in lines) + b'{"ts": 1')
    result = ingest_paths([path], block_size=4, salt=b"s", anchor=ANCHOR)
    summary = result.summary
    assert (summary.records_read, summary.ingested, summary.quarantined) == (6, 4, 2)
    assert summary.duplicate_request_ids == 1
    assert result.requests["request_id"].to_list() == ["b", "c", "a", "d"]
    assert result.requests["arrival"].is_sorted()
    # lines 2 and 3 (10 s) come after line 1 (30 s); line 4 is a dropped duplicate id
    assert summary.out_of_order == 2
    assert summary.duplicate_timestamps == 1
    got = result.quarantine.select("source_line", "field", "reason").rows()
    assert got == [(4, "request_id", "duplicate_request_id"), (6, "<line>", "truncated_last_line")]
    printed = summary_text(summary)
    assert str(path) in printed
    assert "read 6 records from 1 file(s): 4 ingested, 2 quarantined" in printed


def test_ingest_counts_reconcile_across_formats(tmp_path: Path) -> None:
    paths = []
    for fmt in ("token-ids", "prompt-text", "openai-chat", "tracelab"):
        bad = jline(with_path(GOOD[fmt], COUNT_FIELDS[fmt][0], -1))
        paths.append(write(tmp_path, jline(GOOD[fmt]) + bad + b"not json\n", f"{fmt}.jsonl"))
    result = ingest_paths(paths, block_size=4, salt=b"s", anchor=ANCHOR)
    s = result.summary
    assert (s.records_read, s.ingested, s.quarantined) == (12, 4, 8)
    assert s.quarantined_by_reason == {"invalid_json": 4, "negative": 4}
    for f in s.files:
        assert f.records_read == f.ingested + f.quarantined == 3
    assert result.quarantine.height == 8
    assert set(pl.Series(result.quarantine["source_file"]).unique()) == {str(p) for p in paths}


# ---------------------------------------------------------------------------------------------
# A corrupted canonical Parquet must be a clean error, not a dead process


def test_corrupt_canonical_parquet_is_a_clean_error() -> None:
    # Run in a child process: the failure mode is an abort that would take pytest down with it.
    path = Path(__file__).resolve().parent / "data" / "traces" / "corrupt_canonical.parquet"
    script = (
        "import sys\n"
        "from pipeline.errors import InputFormatError\n"
        "from pipeline.ingest.readers import ReadContext, SourceFile, reader_named\n"
        "try:\n"
        f"    reader_named('canonical-parquet').read(SourceFile.of({str(path)!r}), ReadContext())\n"
        "except InputFormatError:\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 3, done.stderr.decode(errors="replace")[-500:]


class _BrokenTokenizer:
    name = "broken"
    approximate = False

    def encode(self, text: str) -> list[int]:
        raise RuntimeError("tokenizer exploded on " + text)  # the text must not leak


@pytest.mark.parametrize("fmt", ["prompt-text", "openai-chat"])
def test_tokenizer_failure_is_quarantined_without_text(tmp_path: Path, fmt: str) -> None:
    path = write(tmp_path, jline(GOOD[fmt]))
    source = SourceFile.of(path)
    context = ReadContext(block_size=4, salt=b"s", anchor=ANCHOR, tokenizer=_BrokenTokenizer())
    result = detect_reader(source).read(source, context)
    row = result.quarantine.row(0, named=True)
    assert row["reason"] == "untokenizable" and row["detail"] == "RuntimeError"
    assert "hello" not in json.dumps(result.quarantine.to_dicts())
