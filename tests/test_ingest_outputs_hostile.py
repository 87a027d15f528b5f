"""What ingest writes and where, against a hostile user and faults: only into folders
enginefit owns, inside the configured roots, as one consistent set, once per file, one writer at
a time, with the user's umask, failing cleanly on unwritable folders and full disks; a salt only
when something is hashed; the anchor and the sample salt said out loud; a slow fingerprint."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipeline.cli import main as enginefit
from pipeline.commands.ingest import configured_inputs
from pipeline.config import load_config
from pipeline.errors import ConfigError, InputFormatError
from pipeline.hashing import salt_fingerprint
from pipeline.ingest import stage
from pipeline.ingest.compute import BUNDLED_SAMPLE_SHA256, expand_paths, ingest_paths
from pipeline.layout import WorkloadLayout
from pipeline.store import OutputError, read_requests, verify_ingest
from tests.conftest import REPO, write_config, write_requests

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
WHERE_TO = "choose another output folder (--out DIR, or paths.data_dir in the configuration)"


def azure(path: Path, rows: int = 3, first_tokens: int = 10) -> Path:
    body = "".join(f"2023-11-16 18:00:{i:02d}.0,{first_tokens + i},1\n" for i in range(rows))
    path.write_text(AZURE + body)
    return path


def mooncake(path: Path, rows: int = 2, first_ts: int = 0) -> Path:
    lines = [
        json.dumps(
            {
                "timestamp": first_ts + 1000 * i,
                "input_length": 1024,
                "output_length": 5,
                "hash_ids": [i, 7],
            }
        )
        for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line a failed command printed (after the configuration line)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("enginefit ingest: configuration:")
    return err[1]


@pytest.fixture
def salted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "a-secret")


def ingest(*argv: str | Path) -> int:
    return enginefit(["ingest", *map(str, argv)])


def tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (files with their bytes, folders as None)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


# ---------------------------------------------------------------------------------------------
# 1. Never delete what enginefit did not write.


def test_a_non_empty_folder_without_the_marker_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    out = tmp_path / "mine"
    (out / "requests").mkdir(parents=True)
    (out / "requests" / "keep.parquet").write_bytes(b"the user's own data")
    (out / "notes.txt").write_text("mine")
    before = tree(out)
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 2
    assert error_line(capsys) == (
        f"enginefit: error: {out}: folder is not empty and not an enginefit workload (no "
        ".enginefit-workload marker; holds notes.txt, requests); enginefit never replaces "
        f"files it did not write: {WHERE_TO}"
    )
    assert tree(out) == before  # not even a lock or marker was added


def test_a_workload_of_an_older_enginefit_is_refused_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    out = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 0
    for marked in (".enginefit-workload", "ingest_manifest.json"):  # what older versions lacked
        (out / marked).unlink()
    capsys.readouterr()
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 2
    assert error_line(capsys).endswith(
        f"{WHERE_TO} (if an older enginefit wrote it, delete it and ingest again)"
    )


def test_foreign_files_inside_a_workload_are_never_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    out = tmp_path / "w"
    trace = azure(tmp_path / "a.csv")
    assert ingest(trace, "--out", out) == 0
    (out / "requests" / "keep.txt").write_text("mine")
    capsys.readouterr()
    assert ingest(trace, "--out", out) == 2
    assert error_line(capsys) == (
        f"enginefit: error: {out}: holds requests/keep.txt, which enginefit did not write; "
        f"move them out of the workload folder or {WHERE_TO}"
    )
    assert (out / "requests" / "keep.txt").read_text() == "mine"
    assert (out / "requests" / "part-00000.parquet").exists()


def test_an_empty_folder_becomes_a_workload_and_a_rerun_replaces_only_its_own_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, salted: None
) -> None:
    out = tmp_path / "w"
    out.mkdir()
    monkeypatch.setattr(stage, "ROWS_PER_PART", 2)
    assert ingest(azure(tmp_path / "a.csv", rows=5), "--out", out) == 0
    layout = WorkloadLayout(out)
    assert [p.name for p in layout.ingest.parts()] == [f"part-0000{i}.parquet" for i in range(3)]
    assert layout.marker.is_file()
    assert ingest(azure(tmp_path / "b.csv", rows=1), "--out", out) == 0
    assert [p.name for p in layout.ingest.parts()] == ["part-00000.parquet"]
    assert read_requests(layout).collect()["prompt_tokens"].to_list() == [10]
    # only the workload's own files remain: marker, lock, the set and its manifest
    assert sorted(p.name for p in out.iterdir()) == [
        ".enginefit-workload",
        ".enginefit.lock",
        "ingest_manifest.json",
        "ingest_summary.json",
        "quarantine.parquet",
        "requests",
    ]


def test_a_folder_holding_only_later_stage_outputs_is_an_enginefit_workload(
    tmp_path: Path, salted: None
) -> None:
    """The Dagster graph may write bench/ before the workload asset runs: those are enginefit's."""
    out = tmp_path / "w"
    layout = WorkloadLayout(out)
    layout.bench.dir.mkdir(parents=True)
    layout.bench.points.write_bytes(b"enginefit's")
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 0
    assert layout.marker.exists() and layout.bench.points.read_bytes() == b"enginefit's"
    (layout.bench.dir / "mine.txt").write_text("x")
    layout.marker.unlink()
    with pytest.raises(OutputError, match="not an enginefit workload"):
        write_requests(read_requests(layout).collect(), layout.root)


# ---------------------------------------------------------------------------------------------
# 2. Outputs stay under data_dir (and reports under reports_dir).


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", "team/a", "..", ".hidden", "a/../b"])
def test_a_workload_name_that_is_a_path_is_refused(tmp_path: Path, name: str) -> None:
    config = write_config(tmp_path, ["t.csv"], name=json.dumps(name))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert message.startswith(f"{config}: workload.name: ") and "is not a workload name" in message


def test_layout_stays_under_data_dir_even_past_validation(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, ["t.csv"]))
    assert config.layout().root == tmp_path / "data" / "t"
    assert config.workload is not None
    sneaky = dataclasses.replace(
        config, workload=config.workload.model_copy(update={"name": "../../etc"})
    )
    with pytest.raises(ConfigError, match=r"workload.name: '../../etc' is not a safe folder name"):
        sneaky.layout()
    assert config.paths.report_folder("2026-01") == tmp_path / "reports" / "2026-01"
    with pytest.raises(ConfigError, match=r"report name: '../x' is not a safe folder name"):
        config.paths.report_folder("../x")


def test_a_data_dir_that_is_a_file_is_refused_by_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a folder")
    config = write_config(tmp_path, ["t.csv"])
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value).startswith(f"{config}: paths.data_dir: ")
    assert f"{tmp_path / 'data'} is a file, not a folder" in str(caught.value)


# ---------------------------------------------------------------------------------------------
# 3. One consistent set, checked on read.


def test_the_manifest_names_every_file_of_the_set(tmp_path: Path, salted: None) -> None:
    out = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 0
    paths = WorkloadLayout(out).ingest
    manifest = json.loads(paths.manifest.read_text())
    part = paths.part(0)
    assert manifest == {
        "parts": {"part-00000.parquet": part.stat().st_size},
        "quarantine": {
            "bytes": paths.quarantine.stat().st_size,
            "sha256": hashlib.sha256(paths.quarantine.read_bytes()).hexdigest(),
        },
        "summary": {
            "bytes": paths.summary.stat().st_size,
            "sha256": hashlib.sha256(paths.summary.read_bytes()).hexdigest(),
        },
    }


class Killed(BaseException):
    """Stands for a kill: nothing after it runs, no handler catches it."""


def test_a_kill_between_the_renames_leaves_a_set_every_reader_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = WorkloadLayout(tmp_path / "w")
    stage.write(ingest_paths([azure(tmp_path / "a.csv", rows=2)], salt=b"s"), layout)
    new = ingest_paths([azure(tmp_path / "b.csv", rows=5)], salt=b"s")
    real_replace = Path.replace

    def killed_at_the_summary(self: Path, target: Path) -> Path:
        if Path(target) == layout.ingest.summary:
            raise Killed
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", killed_at_the_summary)
    with pytest.raises(Killed):
        stage.write(new, layout)
    monkeypatch.undo()
    # requests/ is the new run's, the summary the old one's: nobody may read them together
    assert pl.scan_parquet(layout.ingest.parts()).collect().height == 5
    assert json.loads(layout.ingest.summary.read_text())["ingested"] == 2
    expected = (
        f"{layout.root}: ingest outputs are incomplete or from different runs (no "
        "ingest_manifest.json: interrupted, or an older version); re-run `enginefit ingest` "
        "for this workload (or materialise `workload`)"
    )
    for read in (read_requests, stage.read_summary):
        with pytest.raises(InputFormatError) as caught:
            read(layout)
        assert str(caught.value) == expected
    assert enginefit(["shape", str(layout.root)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"enginefit: error: {expected}"
    stage.write(new, layout)  # a re-run makes it whole again
    assert stage.read_summary(layout).ingested == 5


@pytest.mark.parametrize(
    ("swap", "problem"),
    [
        ("ingest_summary.json", "ingest_summary.json differs from the manifest"),
        ("quarantine.parquet", "quarantine.parquet differs from the manifest"),
        (
            "requests/part-00000.parquet",
            "request parts differ from the manifest: requests/part-00000.parquet",
        ),
    ],
)
def test_files_mixed_from_two_runs_are_refused(tmp_path: Path, swap: str, problem: str) -> None:
    one, two = WorkloadLayout(tmp_path / "one"), WorkloadLayout(tmp_path / "two")
    stage.write(ingest_paths([azure(tmp_path / "a.csv", rows=2)], salt=b"s"), one)
    body = AZURE + "2023-11-16 18:00:00.0,5,1\n2023-11-16 18:00:01.0,-1,1\n"
    (tmp_path / "b.csv").write_text(body + "2023-11-16 18:00:02.0,7,1\n" * 3)
    stage.write(ingest_paths([tmp_path / "b.csv"], salt=b"s"), two)
    shutil.copyfile(two.root / swap, one.root / swap)
    with pytest.raises(InputFormatError, match=rf"\({problem}\); re-run `enginefit ingest`"):
        verify_ingest(one)


def test_staging_leftovers_are_never_read_and_are_cleaned_by_the_next_write(
    tmp_path: Path, salted: None
) -> None:
    out = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 0
    part = out / "requests" / "part-00000.parquet"
    for leftover in (".requests.0a1b2c", ".requests.old.123", ".requests.reads.0a1b2c3d4e5f6a7b"):
        (out / leftover).mkdir()
        shutil.copyfile(part, out / leftover / "part-00000.parquet")
    (out / ".quarantine.parquet.9f8e7d").write_bytes(b"half a file")
    assert expand_paths([out]) == expand_paths([out / "requests"])
    assert [s.path for s in expand_paths([out])] == [part]
    assert read_requests(WorkloadLayout(out)).collect().height == 3
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 0
    assert not [p.name for p in out.iterdir() if p.name.startswith((".requests", ".quarantine"))]


def test_hidden_folders_inside_a_trace_folder_are_not_traces(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    (traces / ".requests.abc").mkdir(parents=True)
    azure(traces / "a.csv")
    azure(traces / ".requests.abc" / "b.csv")
    assert [s.path for s in expand_paths([traces])] == [traces / "a.csv"]


# ---------------------------------------------------------------------------------------------
# 4. A file given twice is read once, and the summary says so.


def test_the_same_file_given_twice_is_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    trace = azure(tmp_path / "a.csv", rows=4)
    (tmp_path / "link.csv").symlink_to(trace)
    shutil.copyfile(trace, tmp_path / "copy.csv")
    assert ingest("a.csv", "./a.csv", "link.csv", "copy.csv", "a.csv", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["records_read"], summary["ingested"], summary["quarantined"]) == (4, 4, 0)
    assert [(f["file"], f["records_read"], f["ingested"]) for f in summary["files"]] == [
        ("a.csv", 4, 4)
    ]
    assert summary["skipped_files"] == [
        {"file": "./a.csv", "same_as": "a.csv", "reason": "same path"},
        {"file": "link.csv", "same_as": "a.csv", "reason": "same path"},
        {"file": "copy.csv", "same_as": "a.csv", "reason": "same content"},
        {"file": "a.csv", "same_as": "a.csv", "reason": "same path"},
    ]
    assert ingest("a.csv", "copy.csv") == 0
    text = capsys.readouterr().out
    assert "read 4 records from 1 file(s): 4 ingested, 0 quarantined" in text
    assert "note: skipped copy.csv: same content as a.csv (read once)" in text


def test_configured_traces_naming_one_file_twice_keep_their_formats_aligned(
    tmp_path: Path,
) -> None:
    trace = mooncake(tmp_path / "m.jsonl")
    azure(tmp_path / "b.csv")
    config = write_config(tmp_path, [str(trace), str(trace), str(tmp_path / "b.csv")])
    raw = yaml.safe_load(config.read_text())
    raw["workload"]["traces"] = [
        {"path": str(trace), "format": "mooncake"},
        {"path": str(trace), "format": "mooncake"},
        {"path": str(tmp_path / "b.csv"), "format": "azure"},
    ]
    config.write_text(yaml.safe_dump(raw))
    summary = stage.run(configured_inputs(load_config(config))).summary
    assert [(f.format, f.records_read) for f in summary.files] == [("mooncake", 2), ("azure", 3)]
    assert [s.reason for s in summary.skipped_files] == ["same path"]


# ---------------------------------------------------------------------------------------------
# 5. One writer at a time.


@pytest.fixture
def held_lock(tmp_path: Path, salted: None) -> Iterator[Path]:
    """A workload whose lock another process holds (a second open file description conflicts
    with flock just as another process's does)."""
    out = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv", rows=2), "--out", out) == 0
    with (out / ".enginefit.lock").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield out


def test_a_second_ingest_into_a_busy_workload_is_refused_and_changes_nothing(
    held_lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(held_lock)
    capsys.readouterr()
    assert ingest(azure(tmp_path / "b.csv", rows=5), "--out", held_lock) == 2
    assert error_line(capsys) == (
        f"enginefit: error: {held_lock}: another enginefit command is writing this workload (it "
        "holds .enginefit.lock); wait for it to finish, or write elsewhere with --out DIR"
    )
    assert tree(held_lock) == before


def test_the_workload_asset_path_also_waits_its_turn(held_lock: Path, tmp_path: Path) -> None:
    result = ingest_paths([azure(tmp_path / "b.csv")], salt=b"s")
    with pytest.raises(OutputError, match="another enginefit command is writing this workload"):
        stage.write(result, WorkloadLayout(held_lock))


# ---------------------------------------------------------------------------------------------
# 6. The user's umask.


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_outputs_follow_the_umask(
    tmp_path: Path, salted: None, umask: int, file_mode: int, dir_mode: int
) -> None:
    previous = os.umask(umask)
    try:
        assert ingest(azure(tmp_path / "a.csv"), "--out", tmp_path / "w") == 0
    finally:
        os.umask(previous)
    layout = WorkloadLayout(tmp_path / "w")
    files = [layout.ingest.summary, layout.ingest.quarantine, layout.ingest.manifest, layout.marker]
    assert {f.name: f.stat().st_mode & 0o777 for f in [*files, *layout.ingest.parts()]} == {
        f.name: file_mode for f in [*files, *layout.ingest.parts()]
    }
    assert layout.ingest.requests.stat().st_mode & 0o777 == dir_mode


# ---------------------------------------------------------------------------------------------
# 7. Unwritable outputs and full disks: one line, exit 2, the previous set intact.


def test_an_out_that_is_a_file_or_under_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    trace = azure(tmp_path / "a.csv")
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    assert ingest(trace, "--out", blocker) == 2
    assert error_line(capsys) == f"enginefit: error: {blocker}: is a file, not a folder; {WHERE_TO}"
    assert ingest(trace, "--out", blocker / "sub") == 2
    assert error_line(capsys) == (
        f"enginefit: error: {blocker / 'sub'}: cannot write: a file is in the way where a "
        f"folder is needed; {WHERE_TO}"
    )
    assert blocker.read_text() == "x"


def test_a_read_only_output_folder_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    salted: None,
) -> None:
    """Read-only as the kernel reports it (EROFS on creating the folder; root ignores chmod, so
    the failure is injected where the first write happens)."""
    out = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        if self == out:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert ingest(azure(tmp_path / "a.csv"), "--out", out) == 2
    assert (
        error_line(capsys)
        == f"enginefit: error: {out}: cannot write: read-only file system; {WHERE_TO}"
    )


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ("part", "no space left on the device; free space or " + WHERE_TO),
        ("summary", "file too large for the file system; " + WHERE_TO),
    ],
)
def test_a_full_disk_leaves_the_previous_set_published_and_no_leftovers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    salted: None,
    fail: str,
    message: str,
) -> None:
    out = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv", rows=2), "--out", out) == 0
    before = tree(out)
    capsys.readouterr()
    if fail == "part":  # polars reports the OS error inside its own exception

        def full(self: pl.DataFrame, path: Path, **kwargs: object) -> None:
            raise pl.exceptions.ComputeError(
                "parquet: underlying IO error: No space left on device (os error 28)"
            )

        monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    else:
        real_write_bytes = Path.write_bytes

        def too_large(self: Path, data: bytes) -> int:  # type: ignore[override]
            if self.name.startswith(".ingest_summary.json."):
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
            return real_write_bytes(self, data)

        monkeypatch.setattr(Path, "write_bytes", too_large)
    assert ingest(azure(tmp_path / "b.csv", rows=5), "--out", out) == 2
    target = out / ("requests/part-00000.parquet" if fail == "part" else "ingest_summary.json")
    assert error_line(capsys) == f"enginefit: error: {target}: cannot write: {message}"
    monkeypatch.undo()
    assert tree(out) == before  # nothing staged is left, nothing of the old set changed
    assert stage.read_summary(WorkloadLayout(out)).ingested == 2


# ---------------------------------------------------------------------------------------------
# 8. A salt only when something is hashed.


def test_a_trace_without_content_needs_no_salt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = azure(tmp_path / "a.csv")
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        f"workload:\n  name: t\n  traces: [{trace}]\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n"
    )
    assert ingest("--config", config, "--json") == 0
    assert json.loads(capsys.readouterr().out)["salt_fingerprint"] is None
    assert enginefit(["config", "--config", str(config)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["workload"]["hash_salt_fingerprint"] is None
    assert ingest(trace, "--out", tmp_path / "adhoc") == 0  # no configuration, no salt


def test_a_trace_with_content_and_no_salt_names_the_key_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = mooncake(tmp_path / "m.jsonl")
    assert ingest(azure(tmp_path / "a.csv"), trace, "--out", tmp_path / "w") == 2
    assert error_line(capsys) == (
        f"enginefit: error: {trace}: no hash salt, and this trace's prompt content (or block "
        "ids) is stored as salted hashes: set workload.hash_salt in the configuration "
        "(--config FILE) or the ENGINEFIT_HASH_SALT environment variable"
    )
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# 9. Which anchor dated a relative trace.


def test_the_default_anchor_is_named_and_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    trace = mooncake(tmp_path / "m.jsonl", first_ts=5000)
    assert ingest(trace, "--out", tmp_path / "w", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["anchor"], summary["anchor_is_default"]) == ("2000-01-01T00:00:00+00:00", True)
    assert summary["warnings"] == [
        "arrivals start at 2000-01-01T00:00:05+00:00: relative timestamps dated from the "
        "default anchor 2000-01-01T00:00:00+00:00, so the dates are placeholders; set "
        "workload.anchor (or --anchor) to the trace's real start"
    ]
    assert ingest(trace, "--out", tmp_path / "w") == 0
    text = capsys.readouterr().out
    assert (
        "anchor of relative timestamps: 2000-01-01T00:00:00+00:00 (the built-in default, not "
        "set by you: workload.anchor or --anchor)"
    ) in text
    assert "warning: arrivals start at 2000-01-01T00:00:05+00:00" in text


def test_a_chosen_anchor_is_named_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    trace = mooncake(tmp_path / "m.jsonl")
    assert ingest(trace, "--out", tmp_path / "w", "--anchor", "2024-05-01", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["anchor"], summary["anchor_is_default"]) == ("2024-05-01T00:00:00+00:00", False)
    assert summary["warnings"] == []
    # absolute timestamps under the default anchor: named, not warned about
    assert ingest(azure(tmp_path / "a.csv"), "--out", tmp_path / "z", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["anchor_is_default"] is True and summary["warnings"] == []
    # … and the text says the anchor dated nothing, not that a default stands in for a choice
    assert ingest(azure(tmp_path / "a.csv"), "--out", tmp_path / "z") == 0
    text = capsys.readouterr().out
    assert "anchor of relative timestamps: none needed: every timestamp is an absolute time" in text
    assert "not set by you" not in text
    config = write_config(tmp_path, [str(trace)], anchor="2024-06-01")
    assert ingest("--config", config) == 0
    assert "anchor of relative timestamps: 2024-06-01T00:00:00+00:00 (set by you)" in (
        capsys.readouterr().out
    )


# ---------------------------------------------------------------------------------------------
# 10. The bundled sample salt on anything but the bundled samples.


def test_the_bundled_sample_digests_are_the_bundled_traces() -> None:
    bundled = {p for p in (REPO / "traces").rglob("*") if p.is_file() and p.name != "NOTICE"}
    assert {hashlib.sha256(p.read_bytes()).hexdigest() for p in bundled} == BUNDLED_SAMPLE_SHA256


def test_the_sample_salt_on_a_real_trace_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "enginefit-bundled-sample-salt")
    mine = mooncake(tmp_path / "mine.jsonl")
    sample = REPO / "traces" / "mooncake" / "conversation_trace.jsonl"
    assert ingest(mine, "--out", tmp_path / "w", "--anchor", "2024-01-01") == 0
    text = capsys.readouterr().out
    assert (
        f"warning: the bundled sample salt protects the hashes of {mine}, which is not a bundled "
        "sample trace: anyone can recompute them; set your own secret workload.hash_salt (or "
        "ENGINEFIT_HASH_SALT) and ingest again"
    ) in text
    stored = stage.read_summary(WorkloadLayout(tmp_path / "w"))
    assert len(stored.warnings) == 1 and str(mine) in stored.warnings[0]
    assert ingest(sample, "--out", tmp_path / "s", "--anchor", "2025-02-21", "--json") == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    # nothing hashed, nothing to protect: no warning
    assert ingest(azure(tmp_path / "a.csv"), "--out", tmp_path / "a", "--json") == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


# ---------------------------------------------------------------------------------------------
# 11. A fingerprint that is slow to confirm a guess against.


def test_the_fingerprint_is_scrypt_with_the_stated_parameters() -> None:
    expected = hashlib.scrypt(
        b"test-salt",
        salt=b"enginefit-salt-fingerprint-v2",
        n=2**15,
        r=8,
        p=1,
        maxmem=64 * 1024 * 1024,
        dklen=6,
    ).hex()
    assert salt_fingerprint(b"test-salt") == expected == "5d58cc2de40d"
    old_unkeyed = hashlib.blake2b(b"test-salt", digest_size=6, person=b"enginefit-salt")
    assert salt_fingerprint(b"test-salt") != old_unkeyed.hexdigest()


def test_the_workload_asset_runs_without_a_salt_and_shows_anchor_and_warnings(
    tmp_path: Path,
) -> None:
    import dagster as dg

    from assets.ingest import workload
    from assets.resources import EnginefitStore

    trace = mooncake(tmp_path / "m.jsonl")
    config = write_config(tmp_path, [str(trace)])
    raw = yaml.safe_load(config.read_text())
    del raw["workload"]["hash_salt"]
    config.write_text(yaml.safe_dump(raw))
    failed = dg.materialize(
        [workload],
        resources={"store": EnginefitStore(config_path=str(config))},
        raise_on_error=False,
    )
    assert not failed.success  # Mooncake block ids are hashed: the salt is needed
    failure = next(e for e in failed.all_events if e.is_step_failure)
    assert failure.step_failure_data.error is not None
    cause = failure.step_failure_data.error.cause
    assert cause is not None and cause.cls_name == "ConfigError"
    assert f"{trace}: no hash salt" in cause.message
    raw["workload"]["traces"] = [str(azure(tmp_path / "a.csv"))]
    config.write_text(yaml.safe_dump(raw))
    result = dg.materialize(
        [workload], resources={"store": EnginefitStore(config_path=str(config))}
    )
    metadata = result.get_asset_materialization_events()[
        0
    ].step_materialization_data.materialization.metadata
    assert metadata["salt_fingerprint"].value == "none (nothing hashed)"
    # Azure timestamps are absolute: the built-in anchor dated nothing
    assert metadata["anchor"].value == "none needed: every timestamp is an absolute time"
    assert metadata["warnings"].value == "none"


def test_a_failed_ingest_leaves_no_folder_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], salted: None
) -> None:
    """The output folder is claimed (and locked) before reading; a run that fails undoes it."""
    assert ingest(tmp_path / "missing.csv", "--out", tmp_path / "new" / "deeper" / "w") == 2
    assert error_line(capsys) == f"enginefit: error: {tmp_path / 'missing.csv'}: file not found"
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "w"
    assert ingest(azure(tmp_path / "a.csv"), "--out", existing) == 0
    before = tree(existing)
    assert ingest(tmp_path / "missing.csv", "--out", existing) == 2
    assert tree(existing) == before  # a workload that had outputs keeps them all


@pytest.mark.parametrize("damage", ["overwritten footer", "truncated"])
def test_a_damaged_request_part_is_named_by_every_way_of_reading_it(
    tmp_path: Path, damage: str, salted: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to be taken for a raw trace folder, and the error blamed an unrelated file
    ("bench_analysis.json: unrecognised trace format"), or a polars traceback surfaced."""
    config = write_config(tmp_path, [str(mooncake(tmp_path / "m.jsonl", rows=50))])
    assert enginefit(["ingest", "--config", str(config)]) == 0
    layout = load_config(config).layout()
    (layout.root / "bench_analysis.json").write_text("{}")  # a later stage's output beside it
    part = layout.ingest.parts()[0]
    data = part.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # same size (the manifest's check passes), garbage where the footer was
        data = data[:-300] + bytes(b ^ 0x5A for b in data[-300:-8]) + data[-8:]
    part.write_bytes(data)
    capsys.readouterr()
    for argv in (["shape", str(layout.root)], ["shape", str(layout.ingest.requests)]):
        assert enginefit(argv) == 2
        err = capsys.readouterr().err
        assert f"enginefit: error: {part}: damaged Parquet file (" in err, err
        assert "re-run `enginefit ingest`" in err and "Traceback" not in err
    assert enginefit(["shape", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    if damage == "truncated":  # another size than the manifest's
        assert f"{layout.root}: ingest outputs are incomplete" in err
        assert "request parts differ from the manifest: requests/part-00000.parquet)" in err
    else:
        assert f"enginefit: error: {part}: damaged Parquet file (" in err, err
