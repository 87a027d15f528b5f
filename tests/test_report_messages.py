"""What ``enginefit report`` tells a person waiting for it and after it: a line for a step that
runs long, and the command that opens the UI on the run history it just wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from assets.cli import CHECKOUT, ui_command
from assets.progress import RUNNING_AFTER_SECONDS, RUNNING_EVERY_SECONDS, StepLines


def test_a_step_running_long_gets_a_line_and_another_while_it_goes_on() -> None:
    lines = StepLines()
    lines.started("simulation_scenarios.scenario[b512]", now=100.0)
    lines.started("workload_shape", now=102.0)
    assert lines.overdue(100.0 + RUNNING_AFTER_SECONDS - 0.1) == []
    assert lines.overdue(100.0 + RUNNING_AFTER_SECONDS) == [
        "simulation_scenarios.scenario[b512] running (5 s so far)"
    ]
    assert lines.overdue(107.5) == ["workload_shape running (6 s so far)"]  # each step once
    assert lines.overdue(110.0) == []
    again = 100.0 + RUNNING_AFTER_SECONDS + RUNNING_EVERY_SECONDS
    assert lines.overdue(again) == ["simulation_scenarios.scenario[b512] running (25 s so far)"]


def test_make_ui_is_named_only_for_the_home_it_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_home = (CHECKOUT / ".dagster_home").resolve()
    monkeypatch.chdir(CHECKOUT)
    assert ui_command(own_home, CHECKOUT) == "make ui"
    monkeypatch.chdir(tmp_path)
    assert ui_command(own_home, CHECKOUT) == f"make -C {CHECKOUT} ui"
    # another DAGSTER_HOME, or a project elsewhere: the command that opens that one
    other = tmp_path / "my home"
    command = ui_command(other, tmp_path)
    assert command.startswith(f"DAGSTER_HOME='{other}' ")
    assert command.endswith(f"dev -m assets.definitions -d {tmp_path}")
    assert ui_command(own_home, tmp_path).startswith(f"DAGSTER_HOME={own_home} ")
