"""Errors a person can act on: one line naming the path and what to do, exit 2, no traceback."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main, run_parsed
from tests.conftest import REPO, write_config


def _parser_raising(exc: BaseException) -> argparse.ArgumentParser:
    def fail(args: argparse.Namespace) -> int:
        raise exc

    parser = argparse.ArgumentParser(prog="enginefit")
    parser.set_defaults(func=fail)
    return parser


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/w/requests/part-00000.parquet"),
            "/data/w/requests/part-00000.parquet: No space left on device; free some space or "
            "write elsewhere (paths.data_dir)",  # this parser has no --out
        ),
        (
            PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/ro/out"),
            "/ro/out: Permission denied; check the permissions, or write elsewhere",
        ),
        (
            OSError(errno.EIO, os.strerror(errno.EIO)),
            "enginefit: Input/output error",
        ),
    ],
)
def test_operating_system_errors_are_one_line_with_exit_2(
    error: OSError, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_parsed(_parser_raising(error), []) == 2
    assert capsys.readouterr().err == f"enginefit: error: {expected}\n"


def test_an_interrupt_is_one_line_with_the_conventional_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_parsed(_parser_raising(KeyboardInterrupt()), []) == 130
    assert capsys.readouterr().err == "enginefit: interrupted\n"


def test_a_configuration_symlink_loop_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert main(["config", "--config", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"enginefit: error: {tmp_path / 'a.yaml'}: cannot resolve the path")
    assert err.count("\n") == 1


def test_invalid_yaml_is_one_line_with_its_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    bad = tmp_path / "bad.yaml"
    bad.write_text("workload:\n  name: x\n\tsalt: 1\n")
    assert main(["config", "--config", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"enginefit: error: {bad}: not valid YAML: line 3, column 1: found character '\\t' that "
        "cannot start any token\n"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["frob"],
            "enginefit: error: argument COMMAND: invalid choice: 'frob'",
        ),
        (
            ["bench", "--gpu-hour-usd"],
            "enginefit: error: argument --gpu-hour-usd: expected one argument; see `enginefit "
            "bench --help`",
        ),
    ],
)
def test_usage_errors_are_one_line_with_where_help_is(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1 and "usage:" not in err


def test_an_impossible_date_in_the_configuration_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PyYAML turns 2026-13-45 into a crash while parsing; it must reach the key's validator."""
    bad = tmp_path / "enginefit.yaml"
    bad.write_text("workload:\n  name: x\n  traces: [t.jsonl]\nbench:\n  as_of: 2026-13-45\n")
    assert main(["config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"enginefit: error: {bad}: bench.as_of: ") and "2026-13-45" in err
    assert err.count("\n") == 1


def test_every_configuration_problem_is_listed_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four problems, four lines (it said one and "[and 4 more problem(s)]", counting the key
    the misspelling left missing); the required keys a section lacks are one problem."""
    bad = tmp_path / "enginefit.yaml"
    bad.write_text(
        "workload: {nme: w, traces: [t.jsonl], hash_salt: s}\n"
        "shape: {long_tail_ratio: abc}\n"
        "prefix: {min_session_match_blocks: 2.5}\n"
        "requirements: {kv_cache: {layers: 32}}\n"
    )
    assert main(["config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"enginefit: error: {bad}: 4 problems:",
        "  - unknown key workload.nme (did you mean name?); known keys here: anchor, block_size, "
        "daily_quarter, hash_salt, name, tokenizer, traces",
        "  - shape.long_tail_ratio: Input should be a valid number (got 'abc')",
        "  - prefix.min_session_match_blocks: Input should be a valid integer (got 2.5)",
        "  - requirements.kv_cache: required keys missing: gpu_memory_gib, gpus_per_replica, "
        "memory_utilization, overhead_gib, model_params_billion, weight_bytes, kv_heads, "
        "head_dim, kv_bytes",
    ]
    assert "Traceback" not in err


def _enginefit(
    args: list[str], cwd: Path, *, prelude: str = "", stdout: int | None = subprocess.PIPE
) -> subprocess.Popen[str]:
    """``enginefit ARGS`` in a process of its own, after the Python lines ``prelude``."""
    code = f"{prelude}\nimport sys\nfrom assets.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DAGSTER_HOME": str(cwd / "dagster_home"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path: Path) -> None:
    """``enginefit shape --json | head``: the reader is gone before anything is written; the
    command stops as Unix tools do (128 + SIGPIPE), not with "Broken pipe" and exit 2."""
    trace = tmp_path / "m.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n' * 3
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command starts: its first write finds no reader
    proc = _enginefit(["shape", str(trace), "--json"], tmp_path, stdout=write_end)
    os.close(write_end)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGPIPE, err
    assert "error" not in err and "Broken pipe" not in err and "Traceback" not in err


def test_a_full_disk_under_dagster_home_is_one_line_naming_it(tmp_path: Path) -> None:
    """A file-size limit (a full disk, as SQLite sees it) stops Dagster's run storage: one line
    naming DAGSTER_HOME, exit 2, not a SQLAlchemy traceback."""
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n')
    config = write_config(tmp_path, [str(trace)])
    limit = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead\n"
        # Python keeps a bytecode file cut at the limit, and every later import of it fails.
        "sys.dont_write_bytecode = True\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))"
    )
    proc = _enginefit(["decide", "--config", str(config)], tmp_path, prelude=limit)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"enginefit: error: DAGSTER_HOME={tmp_path / 'dagster_home'}: Dagster could not write "
        "its run history (disk I/O error); free some space there, or set DAGSTER_HOME to a "
        "folder with room"
    )
