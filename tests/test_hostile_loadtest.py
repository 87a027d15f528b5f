"""Hostile endpoints for ``enginefit loadtest``: a URL Python cannot even split, an invalid IPv6
host or port 0, given as ``--endpoint`` or as ``loadtest.endpoint``, is one line naming the flag
or the key, exit code 2, before the trace is read or anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as enginefit
from tests.conftest import REPO
from tests.workloads import growing_conversations

DEPLOYMENT = ["--engine", "vllm", "--gpu-type", "H100", "--gpu-count", "1", "--dry-run"]

BAD_ENDPOINTS = [
    ("http://[::1", "not a URL (Invalid IPv6 URL); e.g. http://127.0.0.1:8000/v1"),
    (
        "http://[zz::1]/v1",
        "not a URL ('zz::1' does not appear to be an IPv4 or IPv6 address); "
        "e.g. http://127.0.0.1:8000/v1",
    ),
    ("http://127.0.0.1:0/v1", "port 0 is no server's port (a port is 1 to 65535)"),
]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "conversations.parquet"
    growing_conversations(10, 2, extra_tokens=3, output_tokens=8).write_parquet(path)
    return path


@pytest.mark.parametrize(("endpoint", "why"), BAD_ENDPOINTS)
def test_a_bad_endpoint_flag_is_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], endpoint: str, why: str
) -> None:
    argv = ["loadtest", str(_trace(tmp_path)), "--endpoint", endpoint, "--model", "m"]
    assert enginefit([*argv, *DEPLOYMENT]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"enginefit: error: --endpoint: {why} (got {endpoint!r})"


@pytest.mark.parametrize(("endpoint", "why"), BAD_ENDPOINTS)
def test_a_bad_configured_endpoint_is_one_line_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], endpoint: str, why: str
) -> None:
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "workload": {"name": "w", "traces": [str(_trace(tmp_path))]},
                "loadtest": {"endpoint": endpoint, "model": "m"},
            }
        )
    )
    assert enginefit(["loadtest", "--config", str(config), *DEPLOYMENT]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"enginefit: error: {config}: loadtest.endpoint: {why} (got {endpoint!r})"
    )


def test_the_exit_code_when_no_request_completes_is_documented(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        enginefit(["loadtest", "--help"])
    assert exited.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "Exit code 0 when at least one request completed, 1 when none did (what was measured is "
        "still written), 2 for a bad flag, file or setting (nothing sent), 130 when interrupted."
    ) in said
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "**Exit code** 0 when at least one request completed; 1 when none did" in readme
