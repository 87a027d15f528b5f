"""The `enginefit ingest` command, the `workload` asset and its checks, and the Definitions."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from assets.cli import main as enginefit
from assets.definitions import defs
from assets.ingest import workload
from assets.resources import EnginefitStore
from pipeline.commands.ingest import configured_inputs
from pipeline.config import load_config
from pipeline.ingest import stage as ingest_stage
from pipeline.layout import WorkloadLayout
from tests.conftest import REPO, write_config

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_ingest_command_prints_summary_and_writes_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "a.csv"
    trace.write_text(AZURE + "2023-11-16 18:00:01.0,10,1\n2023-11-16 18:00:05.0,-1,1\n")
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "s")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "w"
    assert enginefit(["ingest", str(trace), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["records_read"], summary["ingested"], summary["quarantined"]) == (2, 1, 1)
    assert summary["quarantined_by_reason"] == {"negative": 1}
    assert (out / "requests" / "part-00000.parquet").exists()
    assert enginefit(["ingest", str(trace), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 ingested, 1 quarantined" in text and "quarantined negative: 1" in text


def test_ingest_command_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "s")
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "nonsense.txt"
    bad.write_text("hello\n")
    assert enginefit(["ingest", str(bad)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("enginefit ingest: configuration: built-in defaults")
    assert len(lines) == 2 and lines[1].startswith("enginefit: error: ")
    assert "nonsense.txt: unrecognised trace format" in lines[1]


def test_workload_asset_and_checks(tmp_path: Path) -> None:
    """Materialising `workload` writes the table and summary; the four checks run and report."""
    trace = tmp_path / "a.csv"
    rows = "".join(f"2023-11-16 18:00:{i:02d}.0,{10 + i},1\n" for i in range(20))
    trace.write_text(AZURE + rows + "2023-11-16 18:01:00.0,oops,1\n")
    config = write_config(tmp_path, [str(trace)])
    from assets.ingest import CHECKS

    result = dg.materialize(
        [workload, *CHECKS], resources={"store": EnginefitStore(config_path=str(config))}
    )
    assert result.success
    meta = result.get_asset_materialization_events()[
        0
    ].step_materialization_data.materialization.metadata
    assert meta["dagster/row_count"].value == 20
    assert meta["quarantined"].value == 1
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["workload_non_empty"].passed
    assert evaluations["workload_arrivals_sorted"].passed
    assert evaluations["workload_no_negative_tokens"].passed
    share = evaluations["workload_quarantine_share"]
    assert not share.passed and share.severity == dg.AssetCheckSeverity.WARN  # 1/21 > 1%
    assert (tmp_path / "data" / "t" / "ingest_summary.json").exists()
    assert not list((tmp_path / "data" / "t").glob(".requests*"))  # the staged rows are removed


def test_the_asset_stages_each_file_and_publishes_what_the_command_does(tmp_path: Path) -> None:
    """Each file's step hands on its rows as a staged Parquet file (nothing of the rows
    through the IO manager), and the merged set equals `enginefit ingest` of the same files."""
    traces = []
    for name, second in (("a.csv", 0), ("b.csv", 30)):
        trace = tmp_path / name
        rows = "".join(f"2023-11-16 18:00:{second + i:02d}.0,{10 + i},1\n" for i in range(25))
        trace.write_text(AZURE + rows + "2023-11-16 18:01:00.0,-5,1\n")
        traces.append(trace)
    config = write_config(tmp_path, [str(t) for t in traces])
    inputs = configured_inputs(load_config(config))
    planned, _ = ingest_stage.plan(inputs)
    read = ingest_stage.read_one(inputs, planned[1])
    staged = ingest_stage.stage_read(read, WorkloadLayout(tmp_path / "staging-check"))
    assert staged.read.result.requests.height == 0 and staged.rows.is_file()
    back = ingest_stage.unstage(staged)
    assert back.result.records_read == read.result.records_read == 26
    assert_frame_equal(back.result.requests, read.result.requests)

    assert dg.materialize(
        [workload], resources={"store": EnginefitStore(config_path=str(config))}
    ).success
    assert enginefit(["ingest", *map(str, traces), "--out", str(tmp_path / "cmd")]) == 0
    asset_dir, command_dir = tmp_path / "data" / "t", tmp_path / "cmd"
    for name in ("requests/part-00000.parquet", "quarantine.parquet"):
        assert_frame_equal(
            pl.read_parquet(asset_dir / name).drop("source_file"),
            pl.read_parquet(command_dir / name).drop("source_file"),
        )
    assert not list(asset_dir.glob(".requests*"))


def test_definitions_load_with_the_workload_asset() -> None:
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "workload" in keys


def test_pipeline_never_imports_dagster_or_assets() -> None:
    """The functional core stays free of the orchestrator (ruff's banned-api rule says so too,
    at the import; this also catches an import ruff is told to ignore)."""
    offenders = []
    for path in (REPO / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path}: {n}" for n in names if n.split(".")[0] in {"dagster", "assets"}]
    assert offenders == []


def test_bundled_config_is_valid() -> None:
    from pipeline.config import load_config

    cfg = load_config(REPO / "enginefit.yaml")
    assert all(Path(t.path).exists() for t in cfg.workload.traces)
