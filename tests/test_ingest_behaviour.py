"""Ingestion across files: reconciling counts, quarantine reasons, sorting, duplicates, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import zstandard

from pipeline.errors import InputFormatError
from pipeline.ingest.compute import ingest_paths
from pipeline.ingest.stage import write as write_workload
from pipeline.layout import WorkloadLayout
from pipeline.store import scan_requests

SALT = b"test-salt"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(tmp_path: Path, body: str, name: str = "azure.csv") -> Path:
    path = tmp_path / name
    path.write_text(AZURE_HEADER + body)
    return path


def _mooncake_line(ts: int, length: int, ids: list[int], out: int = 10) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": length, "output_length": out, "hash_ids": ids}
    )


def _reasons(result: object) -> list[tuple[int, str, str]]:
    q = result.quarantine  # type: ignore[attr-defined]
    return list(
        zip(q["source_line"].to_list(), q["field"].to_list(), q["reason"].to_list(), strict=True)
    )


def test_csv_bad_rows_are_quarantined_with_line_field_and_reason(tmp_path: Path) -> None:
    """Every bad CSV row lands in quarantine with its line, field and reason; counts reconcile."""
    body = (
        "2023-11-16 18:17:03.9799600,100,10\n"  # line 2 ok
        "2023-11-16 18:17:04.0000000,-5,10\n"  # 3 negative
        "2023-11-16 18:17:05.0000000,abc,10\n"  # 4 not an integer
        "2023-11-16 18:17:06.0000000,99999999999,10\n"  # 5 absurd
        "not a time,100,10\n"  # 6 bad timestamp
        "2023-11-16 18:17:07.0000000,100\n"  # 7 missing field
        "\n"  # 8 blank: not a record
        "2023-11-16 18:17:08.0000000,,10\n"  # 9 empty value
        "2023-11-16 18:17:09.0000000,100,10,7\n"  # 10 extra field
        "1899-01-01 00:00:00.0000000,100,10\n"  # 11 implausible
        "2023-11-16 18:17:10.0000000,100,1"  # 12 truncated last line (still parses: kept)
    )
    result = ingest_paths([_azure(tmp_path, body)], salt=SALT)
    assert result.summary.records_read == 10
    assert result.summary.ingested == 2
    assert _reasons(result) == [
        (3, "ContextTokens", "negative"),
        (4, "ContextTokens", "not_an_integer"),
        (5, "ContextTokens", "absurd_value"),
        (6, "TIMESTAMP", "not_a_timestamp"),
        (7, "<line>", "wrong_field_count"),
        (9, "ContextTokens", "missing"),
        (10, "<line>", "wrong_field_count"),
        (11, "TIMESTAMP", "implausible_timestamp"),
    ]
    assert result.requests["source_line"].to_list() == [2, 12]
    assert result.summary.quarantined_by_reason["wrong_field_count"] == 2


def test_invalid_utf8_line_is_quarantined_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(
        AZURE_HEADER.encode() + b"2023-11-16 18:17:03.1,1,2\n2023-11-16 18:17:04.1,\xff\xfe,2\n"
    )
    result = ingest_paths([path], salt=SALT)
    assert _reasons(result) == [(3, "<line>", "invalid_utf8")]
    assert result.summary.ingested == 1


def test_jsonl_bad_lines_and_truncated_last_line(tmp_path: Path) -> None:
    """Invalid JSON mid-file and a cut-off last line are told apart; good lines still ingest."""
    lines = [
        _mooncake_line(0, 1024, [0, 1]),
        "{not json",
        json.dumps([1, 2]),
        _mooncake_line(5, -3, []),
        _mooncake_line(6, 1024, [0]),  # one id for two blocks
        _mooncake_line(7, 1000, [0, 1]),
        _mooncake_line(8, 100, [0])[:20],
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines))
    result = ingest_paths([path], salt=SALT)
    assert _reasons(result) == [
        (2, "<line>", "invalid_json"),
        (3, "<line>", "not_an_object"),
        (4, "input_length", "negative"),
        (5, "hash_ids", "length_mismatch"),
        (7, "<line>", "truncated_last_line"),
    ]
    assert result.summary.records_read == 7 and result.summary.ingested == 2
    # 1000 tokens = one full block + a partial one: only the full block is kept
    assert result.requests["prompt_blocks"].to_list() == [2, 1]


def test_unsorted_arrivals_are_sorted_and_reported(tmp_path: Path) -> None:
    body = "2023-11-16 18:00:03.0,1,1\n2023-11-16 18:00:01.0,2,1\n2023-11-16 18:00:01.0,3,1\n2023-11-16 18:00:02.0,4,1\n"
    result = ingest_paths([_azure(tmp_path, body)], salt=SALT)
    assert result.requests["prompt_tokens"].to_list() == [2, 3, 4, 1]
    assert (
        result.summary.out_of_order == 3
    )  # three records arrive before the 18:00:03 one above them
    assert result.summary.duplicate_timestamps == 1


def test_duplicate_request_ids_keep_the_first(tmp_path: Path) -> None:
    """Two files whose records share request ids: the second file's copies are quarantined as
    duplicates and counted against that file."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(
        '{"ts": 1, "request_id": "x", "prompt_token_ids": [1], "output_tokens": 1}\n'
        '{"ts": 2, "request_id": "y", "prompt_token_ids": [2], "output_tokens": 1}\n'
    )
    second.write_text(
        '{"ts": 3, "request_id": "y", "prompt_token_ids": [3], "output_tokens": 1}\n'
        '{"ts": 4, "request_id": "z", "prompt_token_ids": [4], "output_tokens": 1}\n'
    )
    result = ingest_paths([first, second], salt=SALT)
    assert result.summary.records_read == 4
    assert result.summary.ingested == 3
    assert result.summary.duplicate_request_ids == 1
    assert result.summary.quarantined_by_reason == {"duplicate_request_id": 1}
    assert [(f.ingested, f.quarantined) for f in result.summary.files] == [(2, 0), (1, 1)]
    assert result.requests["request_id"].to_list() == ["x", "y", "z"]


def test_unknown_format_and_empty_file_fail_loudly(tmp_path: Path) -> None:
    unknown = tmp_path / "x.csv"
    unknown.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(
        InputFormatError, match=r"x\.csv: unrecognised trace format; .*mooncake.*azure"
    ):
        ingest_paths([unknown], salt=SALT)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputFormatError, match=r"empty\.jsonl: file is empty"):
        ingest_paths([empty], salt=SALT)
    with pytest.raises(InputFormatError, match="no file matches"):
        ingest_paths([str(tmp_path / "*.nothing")], salt=SALT)


def test_detection_is_by_content_not_extension(tmp_path: Path) -> None:
    disguised = tmp_path / "trace.parquet.txt"
    disguised.write_text(_mooncake_line(0, 512, [0]) + "\n")
    assert ingest_paths([disguised], salt=SALT).summary.files[0].format == "mooncake"


def test_gzip_and_zstd_stream_like_plain_files(tmp_path: Path) -> None:
    text = "\n".join(_mooncake_line(i * 1000, 1024, [0, i + 1]) for i in range(50)) + "\n"
    plain = tmp_path / "p.jsonl"
    plain.write_text(text)
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    zst = tmp_path / "p.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    frames = [
        ingest_paths([p], salt=SALT).requests.drop("request_id", "source_file")
        for p in (plain, gz, zst)
    ]
    assert frames[0].height == 50
    for other in frames[1:]:
        assert other.equals(frames[0])
    csv_gz = tmp_path / "a.csv.gz"
    csv_gz.write_bytes(gzip.compress((AZURE_HEADER + "2023-11-16 18:00:01.0,1,1\n").encode()))
    assert ingest_paths([csv_gz], salt=SALT).summary.files[0].format == "azure"


def test_mixed_block_sizes_are_an_error_but_count_only_traces_join(tmp_path: Path) -> None:
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(_mooncake_line(0, 1024, [0, 1]) + "\n")
    azure = _azure(tmp_path, "2023-11-16 18:00:01.0,1,1\n")
    result = ingest_paths([mooncake, azure], salt=SALT)
    assert result.requests["block_size"].unique().to_list() == [512]


def test_hashed_traces_of_two_block_sizes_are_one_error_naming_each(tmp_path: Path) -> None:
    """Mooncake's 512-token blocks beside token ids hashed in 16-token blocks: which size each
    file has, not a table whose hashes cannot be compared."""
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(_mooncake_line(0, 1024, [0, 1]) + "\n")
    tokens = tmp_path / "t.jsonl"
    ids = ", ".join(str(i) for i in range(32))
    tokens.write_text(
        f'{{"ts": 1, "request_id": "x", "prompt_token_ids": [{ids}], "output_tokens": 1}}\n'
    )
    with pytest.raises(
        InputFormatError, match=r"different block sizes \(16 in \S*t\.jsonl; 512 in \S*m\.jsonl\)"
    ):
        ingest_paths([mooncake, tokens], salt=SALT)


def test_written_workload_is_deterministic_and_scannable(tmp_path: Path) -> None:
    """Same inputs and settings give byte-identical Parquet; the dataset scans lazily."""
    path = _azure(tmp_path, "2023-11-16 18:00:01.0,1,1\n2023-11-16 18:00:02.0,-1,1\n")
    outs = []
    for name in ("a", "b"):
        write_workload(ingest_paths([path], salt=SALT), WorkloadLayout(tmp_path / name))
        outs.append(tmp_path / name)
    for rel in ("requests/part-00000.parquet", "quarantine.parquet", "ingest_summary.json"):
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes()
    lazy = scan_requests(outs[0])
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.select(pl.len()).collect().item() == 1
    summary = json.loads((outs[0] / "ingest_summary.json").read_text())
    assert summary["records_read"] == summary["ingested"] + summary["quarantined"] == 2


def test_canonical_parquet_round_trips(tmp_path: Path) -> None:
    """An ingested workload read back as input gives the same table."""
    path = _azure(tmp_path, "2023-11-16 18:00:01.0,1,1\n2023-11-16 18:00:02.0,5,1\n")
    first = ingest_paths([path], salt=SALT)
    write_workload(first, WorkloadLayout(tmp_path / "w"))
    again = ingest_paths([tmp_path / "w"], salt=SALT)
    assert again.summary.files[0].format == "canonical-parquet"
    assert again.requests.equals(first.requests)


def test_csv_with_leading_blank_lines_keeps_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "lead.csv"
    path.write_text(
        "\n\n" + AZURE_HEADER + "2023-11-16 18:00:01.0,1,1\n2023-11-16 18:00:02.0,x,1\n"
    )
    result = ingest_paths([path], salt=SALT)
    assert result.requests["source_line"].to_list() == [4]
    assert _reasons(result) == [(5, "ContextTokens", "not_an_integer")]


def test_burstgpt_sessionid_spelling_is_accepted(tmp_path: Path) -> None:
    """The README's `SessionID` spelling maps to the session column like `Session ID`."""
    path = tmp_path / "b.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,SessionID,Elapsed time\n"
        "5,ChatGPT,100,20,120,Conversation log,abc,1.5\n"
    )
    row = ingest_paths([path], salt=SALT).requests.row(0, named=True)
    assert (row["session_id"], row["e2e_ms"], row["tenant"], row["model"]) == (
        "abc",
        1500.0,
        "Conversation log",
        "ChatGPT",
    )
