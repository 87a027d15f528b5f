"""Every trace-reading command reads ./enginefit.yaml (or --config) the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from assets.cli import main as enginefit
from pipeline.cli_common import ADHOC_SALT, cli_config, read_settings
from pipeline.errors import ConfigError
from tests.conftest import write_config

LINE = '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}\n'


def test_settings_follow_config_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_config(None) is None  # no ./enginefit.yaml in the test's folder
    assert read_settings(None, None) == {"block_size": 16, "salt": ADHOC_SALT}
    config = cli_config(write_config(tmp_path, ["t.jsonl"], block_size=32, anchor="2024-05-01"))
    settings = read_settings(config, None)
    assert settings["block_size"] == 32 and settings["salt"] == b"test-salt"
    assert str(settings["anchor"]) == "2024-05-01 00:00:00+00:00"
    assert read_settings(config, 64)["block_size"] == 64
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "env")
    assert read_settings(config, None)["salt"] == b"env"
    with pytest.raises(ConfigError, match="--block-size must be positive"):
        read_settings(config, 0)


def test_shape_and_prefix_use_the_configured_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Relative Mooncake timestamps count from the anchor of ./enginefit.yaml in every command."""
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    write_config(tmp_path, [str(trace)], anchor="2024-05-01")
    assert enginefit(["shape", str(trace), "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["shape"]
    assert shape["arrivals"]["first"].startswith("2024-05-01T00:00:00")
    assert enginefit(["ingest", str(trace), "--out", str(tmp_path / "w"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["first_arrival"].startswith("2024-05-01")


def test_ingest_refuses_to_persist_without_a_salt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    assert enginefit(["ingest", str(trace)]) == 2
    assert "no hash salt" in capsys.readouterr().err
