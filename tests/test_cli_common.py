"""Every command reads ./enginefit.yaml (or --config) the same way and says which it used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from assets.cli import main as enginefit
from pipeline.commands.common import cli_config
from pipeline.config import default_config
from pipeline.errors import ConfigError
from pipeline.ingest.stage import ADHOC_SALT, adhoc_inputs
from tests.conftest import write_config

LINE = '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}\n'


def test_read_settings_follow_config_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli_config(None).source is None  # no ./enginefit.yaml in the test's folder
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    bare = adhoc_inputs([trace], default_config().read).context
    assert (bare.block_size, bare.salt) == (16, ADHOC_SALT)
    config = cli_config(write_config(tmp_path, ["t.jsonl"], block_size=32, anchor="2024-05-01"))
    salt = config.require_workload().hash_salt
    context = adhoc_inputs([trace], config.read, salt).context
    assert context.block_size == 32 and context.salt == b"test-salt"
    assert str(context.anchor) == "2024-05-01 00:00:00+00:00"
    assert adhoc_inputs([trace], config.read, salt, block_size=64).context.block_size == 64
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "env")
    assert adhoc_inputs([trace], config.read, salt).context.salt == b"env"
    with pytest.raises(ConfigError, match=r"^--block-size: a block size is 1 to 4096 tokens"):
        adhoc_inputs([trace], config.read, salt, block_size=0)


def test_shape_and_prefix_use_the_configured_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Relative Mooncake timestamps count from the anchor of ./enginefit.yaml in every command,
    and every command names that configuration first."""
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    config = write_config(tmp_path, [str(trace)], anchor="2024-05-01")
    assert enginefit(["shape", str(trace), "--json"]) == 0
    captured = capsys.readouterr()
    shape = json.loads(captured.out)["shape"]
    assert shape["arrivals"]["first"].startswith("2024-05-01T00:00:00")
    assert captured.err.splitlines()[0].startswith(
        f"enginefit shape: configuration: {config} (workload t); workload: {trace} (ad hoc)"
    )
    assert enginefit(["ingest", str(trace), "--out", str(tmp_path / "w"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["first_arrival"].startswith("2024-05-01")


def test_ingest_refuses_to_persist_without_a_salt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    assert enginefit(["ingest", str(trace)]) == 2
    assert "no hash salt" in capsys.readouterr().err


def test_a_command_without_a_configuration_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text(LINE)
    assert enginefit(["prefix", str(trace), "--json"]) == 0
    err = capsys.readouterr().err
    assert "configuration: built-in defaults (no enginefit.yaml; pass --config FILE)" in err
    assert enginefit(["shape"]) == 2
    assert "no workload configured: pass --config FILE" in capsys.readouterr().err
