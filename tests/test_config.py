"""Configuration loading: defaults, paths relative to the file, and errors that name the key."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.config import config_from_mapping, load_config
from pipeline.errors import ConfigError


def _raw(**workload: object) -> dict[str, object]:
    return {"workload": {"traces": ["t.jsonl"], "hash_salt": "s", **workload}}


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "workload:\n  traces: [sub/t.jsonl]\n  hash_salt: s\n  anchor: 2024-05-01\n"
    )
    cfg = load_config(cfg_file)
    assert cfg.workload.block_size == 16
    assert cfg.workload.traces[0].path == str(tmp_path / "sub" / "t.jsonl")
    assert cfg.workload.traces[0].display == "sub/t.jsonl"
    assert cfg.workload.anchor == datetime(2024, 5, 1, tzinfo=UTC)
    assert cfg.paths.data_dir == tmp_path / "data"
    assert cfg.section("simulation") == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "missing 'workload' section"),
        ({"workload": {"hash_salt": "s"}}, "workload.traces"),
        (_raw(hash_salt=""), "hash_salt is empty"),
        (_raw(block_size=0), "block_size must be a positive integer"),
        (_raw(block_size="16"), "block_size must be a positive integer"),
        (_raw(anchor="yesterday"), "workload.anchor 'yesterday'"),
        (_raw(quarantine_warn_share=2), "quarantine_warn_share"),
        ({**_raw(), "shape": [1]}, "section 'shape' must be a mapping"),
    ],
)
def test_bad_settings_name_the_key(
    raw: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENGINEFIT_HASH_SALT", raising=False)
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(raw).section("shape")


def test_salt_from_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "from-env")
    cfg = config_from_mapping(_raw(hash_salt="in-file"))
    assert cfg.workload.hash_salt == "from-env"
    assert "from-env" not in cfg.workload.salt_fingerprint


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
