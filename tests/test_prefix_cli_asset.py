"""``enginefit prefix`` and the ``prefix_sharing`` asset on a small canonical workload."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.prefix import prefix_sessions_consistent, prefix_sharing
from assets.resources import EnginefitStore
from pipeline.cli import main
from pipeline.layout import WorkloadLayout
from pipeline.schema import conform
from tests.conftest import trace_or_missing, write_requests

MOONCAKE = trace_or_missing("traces", "mooncake-fast25", "conversation_trace.jsonl")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _requests() -> pl.DataFrame:
    # Block size 4: a three-turn conversation, a second conversation and a count-only request.
    rows = [
        (0, 10, [1, 2, 3], 2),
        (5, 14, [1, 2, 3, 4], 3),
        (9, 7, [1, 7], 1),
        (20, 20, [1, 2, 3, 4, 5, 6], 5),
        (21, 30, [], 0),
    ]
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"q{i}" for i in range(len(rows))],
                "arrival": [T0 + dt.timedelta(seconds=t) for t, *_ in rows],
                "prompt_tokens": [p for _, p, _, _ in rows],
                "prefix_hashes": [h for *_, h, _ in rows],
                "prompt_blocks": [pb for *_, pb in rows],
                "hashes_known": [True, True, True, True, False],
                "block_size": [4] * len(rows),
            },
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64)},
        )
    )


@pytest.fixture()
def config_path(tmp_path: Path) -> Path:
    write_requests(_requests(), tmp_path / "data" / "t")
    path = tmp_path / "enginefit.yaml"
    path.write_text(
        "workload:\n  name: t\n  traces: [unused.jsonl]\n  block_size: 4\n  hash_salt: test-salt\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n"
        "prefix:\n  min_session_match_blocks: 2\n  reuse_age_buckets_s: [6, 60]\n"
    )
    return path


def test_asset_writes_outputs_deterministically(config_path: Path, tmp_path: Path) -> None:
    store = EnginefitStore(config_path=str(config_path))
    result = dg.materialize(
        [prefix_sharing], resources={"store": store}, selection=[prefix_sharing]
    )
    assert result.success
    out = WorkloadLayout(tmp_path / "data" / "t").prefix
    summary = json.loads(out.summary.read_text())
    # q1 hits 1, 2 and q0's output block 3 (12 tokens); q2 hits block 1 (4); q3 hits 1, 2, 3 and
    # q1's output block 4 (16 tokens, under the 19-token last-token cap).
    assert summary["reuse"]["hit_tokens"] == 12 + 4 + 16
    assert summary["reuse"]["prompt_tokens"] == 10 + 14 + 7 + 20
    assert [b["max_age_s"] for b in summary["reuse"]["by_retention"]] == [6, 60, None]
    # q1 (5 s after q0) fits a 6 s cache; q2's block 1 was last seen 4 s before (q1); q3's
    # shallowest block 1 was last seen 11 s before (q2), so a 6 s cache serves q3 nothing.
    assert [b["hit_tokens"] for b in summary["reuse"]["by_retention"]] == [16, 32, 32]
    assert summary["requests_hashes_unknown"] == 1
    sessions = pl.read_parquet(out.sessions)
    assert sessions["session_id"].to_list() == [
        "inferred-0",
        "inferred-0",
        "inferred-1",
        "inferred-0",
        "inferred-2",
    ]
    assert sessions["turn"].to_list() == [0, 1, 0, 2, 0]
    assert pl.read_parquet(out.curve)["window_tokens"].to_list() == [4, 8, 16]
    assert out.curve_svg.read_bytes().startswith(b"<?xml")
    first = {name: path.read_bytes() for name, path in out.files().items()}
    again = dg.materialize([prefix_sharing], resources={"store": store})
    assert again.success
    assert {name: path.read_bytes() for name, path in out.files().items()} == first
    metadata = result.asset_materializations_for_node("prefix_sharing")[0].metadata
    assert "window (tokens)" in metadata["curve"].value  # type: ignore[operator]


def test_asset_check_passes(config_path: Path) -> None:
    store = EnginefitStore(config_path=str(config_path))
    result = dg.materialize(
        [prefix_sharing, prefix_sessions_consistent], resources={"store": store}
    )
    checks = result.get_asset_check_evaluations()
    assert [c.passed for c in checks] == [True]


def test_cli_on_canonical_parquet(
    config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "data" / "t"
    assert main(["prefix", str(workload), "--json", "--config", str(config_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["reuse"]["hit_tokens"] == 32
    assert summary["block_size"] == 4
    assert main(["prefix", str(workload), "--config", str(config_path), "--block-size", "8"]) == 0
    text = capsys.readouterr().out
    assert "block size 8 tokens" in text
    assert "| window (tokens) |" in text
    assert main(["prefix", str(workload), "--config", str(config_path), "--block-size", "6"]) == 2
    assert "not a multiple" in capsys.readouterr().err


def test_cli_on_mooncake(capsys: pytest.CaptureFixture[str]) -> None:
    if not MOONCAKE.is_file():
        pytest.skip(f"{MOONCAKE} not present")
    assert main(["prefix", str(MOONCAKE), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["block_size"] == 512
    assert summary["requests"] == 12_031
    # Full 512-token blocks only (the reader drops the partial last id): 38.2 % of blocks.
    assert summary["reuse"]["block_hit_share"] == pytest.approx(0.382, abs=5e-4)
    assert summary["curve"][0]["share"] == 1.0
    assert summary["sessions"]["inferred"] is True


def test_cli_keeps_logged_sessions_of_tracelab(capsys: pytest.CaptureFixture[str]) -> None:
    trace = trace_or_missing("traces", "tracelab-examples", "sanitized", "round_trace.jsonl")
    if not trace.is_file():
        pytest.skip(f"{trace} not present")
    assert main(["prefix", str(trace), "--json"]) == 0
    sessions = json.loads(capsys.readouterr().out)["sessions"]
    # SOURCE.md: 19 rounds in 2 logged sessions (claude 10 rounds, codex 9).
    assert (sessions["requests"], sessions["sessions"], sessions["inferred"]) == (19, 2, False)
    assert sessions["turns_max"] == 10
