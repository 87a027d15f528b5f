"""`enginefit report`'s run config: the executor it asks for is one Dagster accepts for the
job, and a bad --max-concurrent is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.cli import main
from assets.definitions import FULL_REPORT, defs, report_run_config
from assets.executors import EXECUTORS, WORKER_PRELOAD


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_run_config_is_valid_for_the_job(executor: str, tmp_path: Path) -> None:
    config = report_run_config(tmp_path / "enginefit.yaml", executor, 3)  # type: ignore[arg-type]
    assert dg.validate_run_config(defs.resolve_job_def(FULL_REPORT), config)
    chosen = config["execution"]["config"]
    assert list(chosen) == [executor]
    if executor == "multiprocess":
        assert chosen["multiprocess"]["max_concurrent"] == 3
        start = chosen["multiprocess"]["start_method"]["forkserver"]
        assert start["preload_modules"] == WORKER_PRELOAD


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_bad_max_concurrent_is_refused(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--config", str(tmp_path / "x.yaml"), "--max-concurrent", value])
    assert exit_info.value.code == 2
    assert "not a whole number of steps, 1 or more" in capsys.readouterr().err
