"""``format: columns``: a CSV or JSON Lines export whose columns the configuration names, read
record by record into the canonical table or the quarantine (counts hand-checked), never
persisting a column it was not told to read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.commands.ingest import configured_inputs
from pipeline.config import load_config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.ingest import stage
from pipeline.ingest.compute import ingest_paths
from pipeline.layout import WorkloadLayout

# A new user's export: a header no built-in format knows, a prompt-text column, a user column.
CSV = (
    "timestamp,prompt,prompt_tokens,completion_tokens,user_id\n"  # line 1: header
    '1735689600,"SECRET, the first prompt",120,30,alice\n'  # 2 ok
    "1735689601.5,hello,80,,bob\n"  # 3 no output, which the mapping names
    "\n"  # 4 blank: not a record
    "1735689602,x,-5,10,carol\n"  # 5 negative prompt_tokens
    "1735689603,y,12.5,10,dave\n"  # 6 prompt_tokens not an integer
    "1735689604,z,10\n"  # 7 wrong field count
    "soon,w,10,10,erin\n"  # 8 timestamp not a number
    "1735689605000,v,10,10,frank\n"  # 9 ms where seconds belong
    ",u,10,10,gina\n"  # 10 no timestamp
    "60,t,10,10,hal\n"  # 11 relative: 60 s after the anchor
)
JSONL_RECORDS = [
    {  # line 1 ok
        "created_ms": 1735689600000,
        "usage": {"input": 100, "output": 20},
        "prompt": "SECRET-PROMPT-TEXT",
        "conv": "c1",
        "latency": 1500,
    },
    {"created_ms": 1735689601000, "usage": {"input": 50, "output": 5}, "conv": "c1"},  # 2 ok
    {"created_ms": 1735689602000, "usage": {"output": 5}},  # 3 no prompt tokens
    {"created_ms": "later", "usage": {"input": 5, "output": 5}},  # 4 not a number
    None,  # 5 not JSON
    {"created_ms": 1735689603000, "usage": {"input": 5, "output": 5}, "latency": -3},  # 6
    {"created_ms": 1735689604000000, "usage": {"input": 5, "output": 5}},  # 7 µs where ms belong
    [1, 2],  # 8 not an object
]
CONFIG = """\
workload:
  name: mapped
  anchor: 2025-03-01T00:00:00Z
  traces:
    - path: export.csv
      format: columns
      columns: {arrival: timestamp, prompt_tokens: prompt_tokens,
                output_tokens: completion_tokens, tenant: user_id}
    - path: export.jsonl
      format: columns
      columns: {arrival: created_ms, arrival_unit: ms, prompt_tokens: usage.input,
                output_tokens: usage.output, session: conv, e2e_ms: latency}
"""


def _project(tmp_path: Path, config: str = CONFIG) -> Path:
    (tmp_path / "export.csv").write_text(CSV, encoding="utf-8")
    lines = ["not json" if r is None else json.dumps(r) for r in JSONL_RECORDS]
    (tmp_path / "export.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "enginefit.yaml"
    path.write_text(config, encoding="utf-8")
    return path


def test_mapped_csv_and_jsonl_are_ingested_or_quarantined_with_reasons(tmp_path: Path) -> None:
    config = load_config(_project(tmp_path))
    result = stage.run(configured_inputs(config))
    summary = result.summary
    by_file = {f.file: (f.format, f.records_read, f.ingested, f.quarantined) for f in summary.files}
    assert by_file == {"export.csv": ("columns", 9, 2, 7), "export.jsonl": ("columns", 8, 2, 6)}
    assert (summary.records_read, summary.ingested, summary.quarantined) == (17, 4, 13)
    quarantine = result.quarantine.select("source_file", "source_line", "field", "reason")
    assert quarantine.rows() == [
        ("export.csv", 3, "completion_tokens", "missing"),
        ("export.csv", 5, "prompt_tokens", "negative"),
        ("export.csv", 6, "prompt_tokens", "not_an_integer"),
        ("export.csv", 7, "<line>", "wrong_field_count"),
        ("export.csv", 8, "timestamp", "not_a_number"),
        ("export.csv", 9, "timestamp", "timestamp_unit_mismatch"),
        ("export.csv", 10, "timestamp", "missing"),
        ("export.jsonl", 3, "usage.input", "missing"),
        ("export.jsonl", 4, "created_ms", "not_a_number"),
        ("export.jsonl", 5, "<line>", "invalid_json"),
        ("export.jsonl", 6, "latency", "negative"),
        ("export.jsonl", 7, "created_ms", "timestamp_unit_mismatch"),
        ("export.jsonl", 8, "<line>", "not_an_object"),
    ]
    columns = ["request_id", "arrival", "prompt_tokens", "output_tokens", "tenant", "session_id"]
    rows = result.requests.select(*columns, "e2e_ms", "source_format").rows()
    at = [datetime(2025, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 1)]
    assert rows == [
        ("export.csv:2", at[0], 120, 30, "alice", None, None, "columns"),
        ("export.jsonl:1", at[0], 100, 20, None, "c1", 1500.0, "columns"),
        ("export.jsonl:2", at[1], 50, 5, None, "c1", None, "columns"),
        (
            "export.csv:11",
            datetime(2025, 3, 1, 0, 1, tzinfo=UTC),
            10,
            10,
            "hal",
            None,
            None,
            "columns",
        ),
    ]
    assert not result.requests["hashes_known"].any()  # counts only: no content was read


def test_columns_not_named_never_reach_an_output(tmp_path: Path) -> None:
    """The prompt-text column and key are never read, so no output file holds them."""
    config = load_config(_project(tmp_path))
    result = stage.run(configured_inputs(config))
    layout = WorkloadLayout(tmp_path / "out")
    stage.write(result, layout)
    written = [p for p in layout.root.rglob("*") if p.is_file()]
    assert written
    for path in written:
        data = path.read_bytes()
        assert b"SECRET" not in data, path


def test_an_unmapped_required_column_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    config = CONFIG.replace("prompt_tokens: prompt_tokens,\n", "\n")
    with pytest.raises(
        ConfigError, match=r"workload\.traces\[0\]\.columns\.prompt_tokens is required"
    ):
        load_config(_project(tmp_path, config))
    unknown = CONFIG.replace("tenant: user_id", "tennant: user_id")
    with pytest.raises(ConfigError, match=r"unknown key workload\.traces\[0\]\.columns\.tennant"):
        load_config(_project(tmp_path, unknown))
    twice = CONFIG.replace("tenant: user_id", "tenant: timestamp")
    with pytest.raises(ConfigError, match="'timestamp' is named for both arrival and tenant"):
        load_config(_project(tmp_path, twice))
    no_mapping = "workload:\n  name: m\n  traces: [{path: export.csv, format: columns}]\n"
    with pytest.raises(ConfigError, match=r"traces\[0\]: format: columns needs a columns mapping"):
        load_config(_project(tmp_path, no_mapping))


def test_a_mapped_column_the_file_lacks_is_named_with_its_key(tmp_path: Path) -> None:
    config = load_config(_project(tmp_path, CONFIG.replace("completion_tokens", "completions")))
    with pytest.raises(
        InputFormatError,
        match=r"export\.csv: the header lacks completions, named by columns\.output_tokens",
    ):
        stage.run(configured_inputs(config))
    jsonl = CONFIG.replace("usage.input", "usage.prompt")
    with pytest.raises(
        InputFormatError,
        match=r"export\.jsonl: the first record lacks usage\.prompt, named by columns\.prompt_tokens",
    ):
        stage.run(configured_inputs(load_config(_project(tmp_path, jsonl))))


def test_an_unrecognised_csv_is_told_each_formats_headers_and_the_mapping(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("timestamp,prompt_tokens,completion_tokens\n1735689600,10,5\n")
    with pytest.raises(InputFormatError) as caught:
        ingest_paths([plain])
    message = str(caught.value)
    assert f"{plain}: unrecognised trace format; the formats and what each needs: " in message
    assert "azure (CSV, header with TIMESTAMP, ContextTokens, GeneratedTokens)" in message
    assert (
        "burstgpt (CSV, header with Timestamp, Model, Request tokens, Response tokens, "
        "Total tokens, Log Type)"
    ) in message
    assert "mooncake (JSONL, keys timestamp, input_length, output_length, hash_ids)" in message
    assert f"{{path: {plain}, format: columns, columns: {{arrival: COLUMN" in message
    assert "\n" not in message


def test_an_empty_mapped_file_is_named_empty(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (tmp_path / "export.csv").write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"^export\.csv: file is empty$"):
        stage.run(configured_inputs(load_config(project)))
