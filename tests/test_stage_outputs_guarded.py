"""Every stage writes only into a folder that is new, empty or enginefit's (never into someone
else's folder), and marks what it writes as an enginefit workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main as enginefit
from tests.conftest import REPO

MOONCAKE = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.parametrize("command", ["shape", "prefix"])
def test_an_ad_hoc_out_folder_of_someone_elses_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    theirs = tmp_path / "notes"
    theirs.mkdir()
    (theirs / "todo.txt").write_text("mine")
    argv = [command, str(MOONCAKE), "--block-size", "512", "--out", str(theirs)]
    assert enginefit(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"enginefit: error: {theirs}: folder is not empty and not an enginefit")
    assert sorted(p.name for p in theirs.iterdir()) == ["todo.txt"]


def test_a_new_out_folder_is_marked_as_an_enginefit_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w"
    assert enginefit(["shape", str(MOONCAKE), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert (out / ".enginefit-workload").is_file()
    assert (out / "shape" / "workload_shape.json").is_file()
