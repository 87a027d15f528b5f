"""Hostile column-mapped traces (``format: columns``): records whose counts contradict each
other (more cached than prompt tokens; no or a negative output length where the mapping names
the column) are quarantined with the reason and counted, so every record read is ingested or
quarantined; a mapping that logs no output length leaves the capacity at the workload's mix
unknown, with that reason, not "the workload has no requests"."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipeline.capacity.stage import require_output_lengths
from pipeline.commands.ingest import configured_inputs
from pipeline.config import load_config
from pipeline.errors import InputFormatError
from pipeline.ingest import stage
from pipeline.layout import WorkloadLayout

CSV = (
    "ts,prompt,cached,completion\n"
    "1735689600,100,500,30\n"  # 2: cached > prompt
    "1735689601,100,100,30\n"  # 3: ok (every prompt token cached)
    "1735689602,100,20,\n"  # 4: no output, the mapping names the column
    "1735689603,100,20,-4\n"  # 5: negative output
    "1735689604,100,,30\n"  # 6: ok (cached not logged)
)
JSONL = [
    {"t": 1735689600, "u": {"in": 100, "cached": 500, "out": 5}},  # 1: cached > prompt
    {"t": 1735689601, "u": {"in": 100, "cached": 40, "out": 5}},  # 2: ok
    {"t": 1735689602, "u": {"in": 100, "cached": 40}},  # 3: no output
    {"t": 1735689603, "u": {"in": 100, "out": -1}},  # 4: negative output
]
MAPPED = """\
workload:
  name: mapped
  traces:
    - path: export.csv
      format: columns
      columns: {arrival: ts, prompt_tokens: prompt, cached_tokens: cached,
                output_tokens: completion}
    - path: export.jsonl
      format: columns
      columns: {arrival: t, prompt_tokens: u.in, cached_tokens: u.cached, output_tokens: u.out}
"""
NO_OUTPUT = """\
workload:
  name: unlogged
  traces:
    - path: export.csv
      format: columns
      columns: {arrival: ts, prompt_tokens: prompt, output_tokens: null}
"""


def _project(tmp_path: Path, config: str) -> Path:
    (tmp_path / "export.csv").write_text(CSV, encoding="utf-8")
    (tmp_path / "export.jsonl").write_text(
        "\n".join(json.dumps(r) for r in JSONL) + "\n", encoding="utf-8"
    )
    path = tmp_path / "enginefit.yaml"
    path.write_text(config, encoding="utf-8")
    return path


def test_contradicting_counts_are_quarantined_counted_and_reconciled(tmp_path: Path) -> None:
    result = stage.run(configured_inputs(load_config(_project(tmp_path, MAPPED))))
    summary = result.summary
    by_file = {f.file: (f.records_read, f.ingested, f.quarantined) for f in summary.files}
    assert by_file == {"export.csv": (5, 2, 3), "export.jsonl": (4, 1, 3)}
    assert (summary.records_read, summary.ingested, summary.quarantined) == (9, 3, 6)
    assert summary.records_read == summary.ingested + summary.quarantined
    rows = result.quarantine.select("source_file", "source_line", "field", "reason").rows()
    assert rows == [
        ("export.csv", 2, "cached", "exceeds_prompt_tokens"),
        ("export.csv", 4, "completion", "missing"),
        ("export.csv", 5, "completion", "negative"),
        ("export.jsonl", 1, "u.cached", "exceeds_prompt_tokens"),
        ("export.jsonl", 3, "u.out", "missing"),
        ("export.jsonl", 4, "u.out", "negative"),
    ]
    kept = result.requests.sort("source_file", "source_line")
    assert kept.select("request_id", "prompt_tokens", "cached_tokens", "output_tokens").rows() == [
        ("export.csv:3", 100, 100, 30),
        ("export.csv:6", 100, None, 30),
        ("export.jsonl:2", 100, 40, 5),
    ]
    # no provider-cached share above 100 % can reach the shape stage
    assert (kept["cached_tokens"].fill_null(0) <= kept["prompt_tokens"]).all()


def test_a_mapping_without_output_lengths_leaves_the_capacity_unknown_with_the_reason(
    tmp_path: Path,
) -> None:
    config = load_config(_project(tmp_path, NO_OUTPUT))
    result = stage.run(configured_inputs(config))
    assert (result.summary.ingested, result.summary.quarantined) == (5, 0)
    requests = result.requests.select("prompt_tokens", "output_tokens")
    assert requests["output_tokens"].null_count() == 5
    layout = config.layout()
    with pytest.raises(InputFormatError) as caught:
        require_output_lengths(requests, layout)
    assert str(caught.value) == (
        f"{layout.ingest.requests}: none of the workload's 5 requests logs an output length (a "
        "trace mapped with output_tokens: null), so its capacity at its own mix is unknown: map "
        "output_tokens to the column that logs it, or compare the engines on the benchmarks' "
        "own figures (`enginefit bench`)"
    )
    assert "no requests" not in str(caught.value)


def test_a_workload_with_some_output_lengths_is_sized_on_those(tmp_path: Path) -> None:
    requests = pl.DataFrame({"prompt_tokens": [10, 20], "output_tokens": [None, 3]})
    require_output_lengths(requests, WorkloadLayout(tmp_path))  # one logs: no error
