"""Hostile surroundings of ``enginefit report`` and ``decide``: a ``DAGSTER_HOME`` that is a
file, and two runs sharing a fresh run history, are one line naming ``DAGSTER_HOME`` with
advice that fits (never "free disk space" for a run that is not out of space)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import sqlalchemy.exc

from assets import cli as dagster_cli
from assets.cli import main as enginefit_with_dagster
from assets.progress import storage_echoes_dropped
from pipeline.errors import EnginefitError
from pipeline.ledger import ReportTree
from tests.conftest import write_config


@pytest.mark.parametrize("command", ["report", "decide"])
def test_a_dagster_home_that_is_a_file_is_named(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n')
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    config = write_config(tmp_path, [str(trace)])
    assert enginefit_with_dagster([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "File exists" not in err
    assert err.strip().splitlines()[-1] == (
        f"enginefit: error: DAGSTER_HOME={home}: not a folder; set DAGSTER_HOME to the folder "
        "for Dagster's run history (or unset it to use .dagster_home beside the configuration)"
    )
    assert home.read_text() == "not a folder\n"


def _storage_failure(error: type[sqlalchemy.exc.DBAPIError], said: str) -> str:
    with pytest.raises(EnginefitError) as caught, dagster_cli._run_storage(Path("/h")):
        raise error("INSERT INTO secondary_indexes", {}, sqlite3.Error(said))
    return str(caught.value)


def test_two_first_runs_on_one_run_history_are_not_a_full_disk() -> None:
    """Two runs creating a fresh run history at once: one of them meets the other's rows."""
    said = "UNIQUE constraint failed: secondary_indexes.name"
    assert _storage_failure(sqlalchemy.exc.IntegrityError, said) == (
        f"DAGSTER_HOME=/h: Dagster could not write its run history ({said}); another enginefit "
        "run was using the same run history at that moment; run again once it has finished, or "
        "give each run its own DAGSTER_HOME"
    )
    assert "another enginefit run" in _storage_failure(
        sqlalchemy.exc.OperationalError, "database is locked"
    )
    assert _storage_failure(sqlalchemy.exc.OperationalError, "disk I/O error").endswith(
        "(disk I/O error); free some space there, or set DAGSTER_HOME to a folder with room"
    )
    assert _storage_failure(sqlalchemy.exc.OperationalError, "no such table: runs").endswith(
        "(no such table: runs); check that folder, or set DAGSTER_HOME to another one"
    )


def test_a_ledger_write_a_crash_left_half_done_is_cleared_by_the_next_publication(
    tmp_path: Path,
) -> None:
    """Killed between writing the ledger's temporary file and renaming it: the next run's
    reconciliation removes the leftover and keeps the ledger as it was."""
    tree = ReportTree(tmp_path / "reports" / "w")
    tree.publish("2025-Q1", 1, {"decision.json": b"{}\n"}, {"identity": "i"}, "vLLM")
    leftover = tree.root / ".index.json.0123456789ab"
    leftover.write_text('{"schema_version": 2, "versions": [')
    unrelated = tree.root / ".index.json.notes"
    unrelated.write_text("kept\n")
    before = tree.ledger.read_bytes()
    assert tree.reconcile() == []
    assert sorted(p.name for p in tree.root.iterdir()) == [
        ".index.json.notes",
        "2025-Q1",
        "index.json",
    ]
    assert tree.ledger.read_bytes() == before


def test_dagster_echoes_of_a_full_run_history_are_left_to_the_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Dagster's own "Exception while writing logger call to event log" (with SQLAlchemy's
    background line) is dropped while a run goes on; the command's line naming DAGSTER_HOME
    says it once."""
    echo = (
        "Exception while writing logger call to event log: (sqlite3.OperationalError) disk "
        "I/O error\n(Background on this error at: https://sqlalche.me/e/21/e3q8)\n"
    )
    with storage_echoes_dropped():
        sys.stderr.write(echo)
        sys.stderr.write("enginefit report: shape done (0.1 s)\n")
    sys.stderr.write("after\n")
    assert capsys.readouterr().err == "enginefit report: shape done (0.1 s)\nafter\n"
