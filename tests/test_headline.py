"""The closing summary of `enginefit report`: one line per stage, read back from what the
stages wrote, saying why when a stage has nothing to show."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.bench.stage import NO_RESULTS
from pipeline.cli import main as enginefit
from pipeline.config import load_config
from pipeline.report.headline import headline_table, headlines
from tests.conftest import bundled_config


def test_stages_not_run_say_which_command_writes_them(tmp_path: Path) -> None:
    config = load_config(bundled_config(tmp_path, "fresh"))
    lines = dict(headlines(config.layout(), config.filing()))
    root = tmp_path / "fresh" / "data" / "mooncake-conversation"
    assert lines["ingest"] == (
        f"not available ({root / 'requests'}: no canonical request table; run `enginefit "
        "ingest --config FILE` or materialise `workload` first)"
    )
    assert lines["bench"].startswith(f"not available ({root / 'bench' / 'bench_analysis.json'}")
    assert lines["capacity"].startswith(
        f"not available ({root / 'capacity' / 'capacity.json'}: no capacity result; run "
        "`enginefit capacity --config FILE` or materialise `workload_capacity` first"
    )
    assert list(lines) == [
        "ingest",
        "shape",
        "prefix",
        "simulation",
        "bench",
        "capacity",
        "decision",
        "report",
    ]


def test_a_bench_stage_without_results_is_reported_as_skipped_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bundled_config(tmp_path, "nobench")
    raw = yaml.safe_load(path.read_text())
    raw["bench"]["results"] = []
    path.write_text(yaml.safe_dump(raw))
    assert enginefit(["bench", "--config", str(path)]) == 0
    capsys.readouterr()
    config = load_config(path)
    lines = dict(headlines(config.layout(), config.filing()))
    assert lines["bench"] == f"skipped: {NO_RESULTS}"


def test_headline_table_aligns_the_stage_names() -> None:
    assert headline_table([("ingest", "a"), ("simulation", "b")]) == (
        "  ingest      a\n  simulation  b"
    )
