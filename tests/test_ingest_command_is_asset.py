"""`enginefit ingest` and the `workload` asset publish the same files, byte for byte, by the same
out-of-core code (:func:`pipeline.ingest.stage.run_publish`), and the same bytes as the eager
merge the command used before: on several generated trace files with repeated request ids
(within and across files), arrivals out of order, equal timestamps, unusable records and a file
named twice."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import dagster as dg
import pytest

from assets.cli import main as enginefit
from assets.ingest import workload
from assets.resources import EnginefitStore
from pipeline.commands.ingest import configured_inputs
from pipeline.config import default_config, load_config
from pipeline.ingest import compute, stage
from pipeline.layout import WorkloadLayout
from pipeline.store import STAGED_READS_PREFIX
from tests.conftest import write_config
from tests.test_ingest_outofcore import _trace

ROWS_PER_PART = 53


def _published(layout: WorkloadLayout) -> dict[str, str]:
    paths = layout.ingest
    files = [*paths.parts(), paths.quarantine, paths.summary, paths.manifest]
    return {
        str(p.relative_to(layout.root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


@pytest.fixture
def traces(tmp_path: Path) -> list[Path]:
    rng = random.Random(7)
    ids = [f"r{i}" for i in range(700)]
    paths = []
    for index in range(3):
        path = tmp_path / "in" / f"part{index}.jsonl"
        path.parent.mkdir(exist_ok=True)
        _trace(path, rng, ids, 200 + 30 * index)
        paths.append(path)
    return [*paths, paths[0]]  # the first file named twice: read once


def _no_eager_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole table merged in memory fails from here on: what runs must be the out-of-core
    merge."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the eager merge ran")

    monkeypatch.setattr(stage, "merge_reads", refuse)
    monkeypatch.setattr(stage, "ingest_sources", refuse)
    monkeypatch.setattr(compute, "merge_reads", refuse)


def test_the_command_and_the_asset_publish_the_same_bytes(
    tmp_path: Path,
    traces: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(stage, "ROWS_PER_PART", ROWS_PER_PART)
    config = write_config(tmp_path, [str(t) for t in traces])
    loaded = load_config(config)
    layout = loaded.layout()
    # Before: the whole table merged in memory, then written (a folder of its own).
    before = WorkloadLayout(tmp_path / "eager")
    stage.write(stage.run(configured_inputs(loaded)), before)

    _no_eager_merge(monkeypatch)
    assert enginefit(["ingest", "--config", str(config), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    by_command = _published(layout)
    assert not list(layout.root.glob(f"{STAGED_READS_PREFIX}*"))

    result = dg.materialize(
        [workload], resources={"store": EnginefitStore(config_path=str(config))}
    )
    assert result.success
    by_asset = _published(layout)

    assert by_command == by_asset == _published(before)
    summary = json.loads(layout.ingest.summary.read_text())
    assert {k: printed[k] for k in summary} == summary
    # What the traces are meant to exercise, so the comparison is not vacuous.
    assert len(layout.ingest.parts()) > 5
    assert summary["duplicate_request_ids"] > 0 and summary["out_of_order"] > 0
    assert summary["duplicate_timestamps"] > 0 and summary["skipped_files"]
    assert set(summary["quarantined_by_reason"]) > {"duplicate_request_id"}
    assert summary["records_read"] == summary["ingested"] + summary["quarantined"]


def test_the_adhoc_command_publishes_what_the_eager_merge_wrote(
    tmp_path: Path,
    traces: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Files named on the command line (``--out DIR``) go the same way: the same bytes as the
    eager merge of the same inputs, and a failing read leaves no staged rows behind."""
    monkeypatch.setattr(stage, "ROWS_PER_PART", ROWS_PER_PART)
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "s")
    monkeypatch.chdir(tmp_path)
    names = [str(t) for t in traces]
    inputs = stage.adhoc_inputs(names, default_config().read, persist=True)
    before = WorkloadLayout(tmp_path / "eager")
    stage.write(stage.run(inputs), before)

    _no_eager_merge(monkeypatch)
    out = tmp_path / "cmd"
    assert enginefit(["ingest", *names, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "quarantined duplicate_request_id" in text and f"wrote {out / 'requests'}" in text
    assert _published(WorkloadLayout(out)) == _published(before)

    bad = tmp_path / "in" / "zz-bad.txt"
    bad.write_text("hello\n")
    assert enginefit(["ingest", *names, str(bad), "--out", str(out)]) == 2
    assert "zz-bad.txt: unrecognised trace format" in capsys.readouterr().err
    assert not list(out.glob(f"{STAGED_READS_PREFIX}*"))
    assert _published(WorkloadLayout(out)) == _published(before)  # the last set stays
