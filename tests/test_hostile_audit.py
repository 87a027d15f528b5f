"""Hostile ``enginefit audit --chain-head`` values: empty, malformed, a digit short, or a whole
page long is a mistyped flag (one line naming it, exit 2, the value echoed at most 80
characters), never the "ledger was rewritten" tamper alarm; the right head in upper case is
the right head."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main as enginefit
from pipeline.commands.report import chain_head_flag

HEAD = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("", "'' (0 characters)"),
        ("not-a-head", "'not-a-head' (10 characters)"),
        (HEAD[:63], f"'{HEAD[:63]}' (63 characters)"),
        ("a" * 100_000, "'" + "a" * 80 + "…' (100,000 characters)"),
    ],
)
def test_a_malformed_chain_head_is_the_flag_not_a_tamper_alarm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, shown: str
) -> None:
    assert enginefit(["audit", str(tmp_path / "v1"), "--chain-head", value]) == 2
    err = capsys.readouterr()
    assert "rewritten" not in err.out + err.err
    assert err.err.strip().splitlines() == [
        "enginefit: error: --chain-head: expected the 64 hex digits an audit prints as the "
        f"chain head, got {shown}"
    ]


def test_the_right_head_in_upper_case_is_the_right_head() -> None:
    assert chain_head_flag(HEAD.upper()) == HEAD
    assert chain_head_flag(f"  {HEAD}\n") == HEAD
    assert chain_head_flag(None) is None
