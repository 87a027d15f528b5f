"""The command and the asset are one code path: on the bundled configuration, `enginefit
<stage> --config` writes byte-identical outputs to what the Dagster graph writes. (`enginefit
decide` has Dagster materialise the stages it finds missing, then decides: its files are compared
with the graph's in tests/test_decision_cli.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from assets.cli import main as enginefit
from assets.definitions import GraphRun
from pipeline.layout import WorkloadLayout
from tests.conftest import bundled_config

STAGES = ("ingest", "shape", "prefix", "simulation", "bench", "capacity")
COMMANDS = {"simulation": "simulate"}


def digests(paths: dict[str, Path]) -> dict[str, str]:
    return {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}


def stage_files(layout: WorkloadLayout) -> dict[str, Path]:
    files = {f"ingest.{k}": v for k, v in layout.ingest.files().items() if v.is_file()}
    files |= {f"ingest.{p.name}": p for p in layout.ingest.parts()}
    for stage in STAGES[1:]:
        paths = getattr(layout, stage).files().items()
        files |= {f"{stage}.{k}": v for k, v in paths if v.is_file()}
    files |= {f"simulation.{p.name}": p for p in layout.simulation.scenario_dir.glob("*.json")}
    return files


def test_commands_write_what_the_assets_write(
    bundled_graph_run: tuple[GraphRun, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, asset_data = bundled_graph_run
    assert run.success, run.failures
    config = bundled_config(tmp_path, "command")
    command_layout = WorkloadLayout(tmp_path / "command" / "data" / "mooncake-conversation")
    for stage in STAGES:
        command = COMMANDS.get(stage, stage)
        assert enginefit([command, "--config", str(config)]) == 0, capsys.readouterr().err
    by_asset = digests(stage_files(WorkloadLayout(asset_data / "mooncake-conversation")))
    by_command = digests(stage_files(command_layout))
    assert sorted(by_asset) == sorted(by_command)
    # 1 part, quarantine, summary, manifest; 6 shape files; 4 prefix files; simulation: 7 tables and
    # figures + 8 scenarios ((1 replica + 3 routings × 4 replicas) × 2 capacities); 12 bench
    # files (no per-request rows in the bundled sweep); 3 capacity files
    assert len(by_asset) == 44
    assert by_command == by_asset
    assert {n for n in by_asset if n.startswith("capacity.")} == {
        "capacity.result",
        "capacity.candidates",
        "capacity.model_errors",
    }


@pytest.mark.parametrize("command", ["shape", "prefix", "simulate"])
def test_a_stage_before_its_inputs_exist_says_which_command_makes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Configured mode on a workload never ingested: one line naming the missing folder and the
    command (or asset) that writes it, exit 2."""
    config = bundled_config(tmp_path, "fresh")
    assert enginefit([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    expected = tmp_path / "fresh" / "data" / "mooncake-conversation" / "requests"
    assert err == (
        f"enginefit: error: {expected}: no canonical request table; run `enginefit ingest "
        "--config FILE` or materialise `workload` first"
    )
