"""Hostile surroundings of any command: an operating-system error is said in words without
Python's ``[Errno N]``, advice names ``--out`` only to a command that has that flag, and
"write elsewhere" only to one that writes."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as enginefit
from pipeline.cli import run_parsed


def _parser(*, with_out: bool) -> argparse.ArgumentParser:
    def full_disk(args: argparse.Namespace) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/w/shape/summary.json")

    parser = argparse.ArgumentParser(prog="enginefit")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("stage")
    if with_out:
        command.add_argument("--out", type=Path, default=None)
    command.set_defaults(func=full_disk)
    return parser


@pytest.mark.parametrize(
    ("with_out", "advice"),
    [
        (True, "free some space or write elsewhere (--out DIR, paths.data_dir)"),
        (False, "free some space or write elsewhere (paths.data_dir)"),
    ],
)
def test_advice_names_out_only_where_the_command_has_it(
    capsys: pytest.CaptureFixture[str], with_out: bool, advice: str
) -> None:
    assert run_parsed(_parser(with_out=with_out), ["stage"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"enginefit: error: /data/w/shape/summary.json: No space left on device; {advice}"
    ]


def test_an_unreadable_catalog_is_said_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "catalog"
    folder.mkdir()
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "workload": {"name": "w", "traces": ["t.jsonl"]},
                "requirements": {"current_engine": "vllm"},
                "decision": {"catalog": str(folder)},
            }
        )
    )
    assert enginefit(["config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Errno" not in err
    assert err.splitlines()[-1] == (
        f"enginefit: error: {folder}: cannot read the engine catalog (Is a directory)"
    )


@pytest.mark.parametrize("command", ["audit", "explain"])
def test_a_command_that_only_reads_is_never_told_to_write_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A path it may not read (as /proc/1/root is to anyone but root)."""
    folder = tmp_path / "locked"
    folder.mkdir()

    def denied(args: argparse.Namespace) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    parser = argparse.ArgumentParser(prog="enginefit")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(command).set_defaults(func=denied)
    commands.add_parser("report").set_defaults(func=denied)
    assert run_parsed(parser, [command]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"enginefit: error: {folder}: Permission denied; check the permissions"
    ]
    assert run_parsed(parser, ["report"]) == 2  # a command that writes may write elsewhere
    assert capsys.readouterr().err.splitlines() == [
        f"enginefit: error: {folder}: Permission denied; check the permissions, or write elsewhere"
    ]
