"""The configuration tree: defaults from one file, paths relative to the file, strict typed
sections reached as ``config.<stage>``, and errors that name the file and the dotted key."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pipeline.config import config_from_mapping, default_config, load_config
from pipeline.errors import ConfigError
from pipeline.settings import default_mapping, parse_yaml
from tests.conftest import REPO


def _raw(**workload: object) -> dict[str, object]:
    return {"workload": {"name": "w", "traces": ["t.jsonl"], "hash_salt": "s", **workload}}


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    """A minimal file gets every default from pipeline/defaults.yaml; paths resolve against it."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "workload:\n  name: w\n  traces: [sub/t.jsonl]\n  hash_salt: s\n  anchor: 2024-05-01\n"
    )
    cfg = load_config(cfg_file)
    defaults = default_mapping()
    assert cfg.workload is not None
    assert cfg.workload.block_size == defaults["workload"]["block_size"] == 16
    assert cfg.workload.traces[0].path == str(tmp_path / "sub" / "t.jsonl")
    assert cfg.workload.traces[0].display == "sub/t.jsonl"
    assert cfg.workload.traces[0].format == "auto"
    assert cfg.workload.anchor == datetime(2024, 5, 1, tzinfo=UTC)
    assert cfg.paths.data_dir == tmp_path / "data"
    assert cfg.layout().root == tmp_path / "data" / "w"
    assert cfg.shape.long_tail_ratio == defaults["shape"]["long_tail_ratio"]
    assert cfg.prefix.reuse_age_buckets_s == (60.0, 600.0, 3600.0)
    assert cfg.simulation.routings == tuple(defaults["simulation"]["routings"])
    assert cfg.bench.slo.itl_definition == "per-gap"
    assert cfg.read.anchor == datetime(2024, 5, 1, tzinfo=UTC)


def test_no_file_means_defaults_and_no_workload() -> None:
    cfg = default_config()
    assert cfg.workload is None and cfg.source is None
    assert cfg.read.block_size == 16
    assert "built-in defaults" in cfg.describe()
    with pytest.raises(ConfigError, match="no workload configured: pass --config FILE"):
        cfg.layout()


def test_every_default_is_documented_once() -> None:
    """Each option in defaults.yaml sits under a comment, and the bundled sample only sets keys
    that exist there (so it never carries a second copy of a default)."""
    text = (REPO / "pipeline" / "defaults.yaml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped and i > 0:
            if stripped.endswith(":"):
                continue  # a section or sub-mapping header
            commented = "#" in line or lines[i - 1].strip().startswith("#")
            assert commented, f"defaults.yaml line {i + 1} has no comment: {line!r}"

    def keys(mapping: dict[str, object], prefix: str = "") -> set[str]:
        out = set()
        for key, value in mapping.items():
            out.add(prefix + key)
            if isinstance(value, dict) and key not in (
                "gpu_hour_usd",
                "slo",
                "kv_cache",
                "scenarios",  # the team's own scenario names
            ):
                out |= keys(value, f"{prefix}{key}.")
        return out

    sample = yaml.safe_load((REPO / "enginefit.yaml").read_text())
    defaults = default_mapping()
    allowed = keys(defaults) | {"workload.name", "workload.traces", "workload.hash_salt"}
    assert keys(sample) <= allowed
    for section, values in sample.items():
        for key, value in values.items():
            if key in defaults.get(section, {}) and not isinstance(value, dict):
                assert value != defaults[section][key], f"{section}.{key} repeats its default"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"workload": None, "shape": {}}, "missing 'workload' section"),
        ({"workload": {"name": "w", "hash_salt": "s"}}, "workload.traces is required"),
        (_raw(hash_salt=""), "workload.hash_salt: String should have at least 1 character"),
        (_raw(block_size=0), "workload.block_size: a block size is 1 to 4096 tokens"),
        (_raw(block_size="16"), "workload.block_size: Input should be a valid integer"),
        (_raw(block_szie=16), "unknown key workload.block_szie (did you mean block_size?)"),
        (_raw(anchor="yesterday"), "workload.anchor: 'yesterday' is not an ISO-8601 date"),
        # a warn share that became a constant (pipeline.ingest.checks) is no longer a key
        (_raw(quarantine_warn_share=0.05), "unknown key workload.quarantine_warn_share"),
        (_raw(name="../../x"), "is not a workload name"),
        (_raw(name="team/a"), "is not a workload name"),
        ({**_raw(), "shape": [1]}, "section 'shape' must be a mapping"),
        ({**_raw(), "benchmark": {}}, "unknown key benchmark"),
        ({**_raw(), "shape": {"long_tail_ratio": "x"}}, "shape.long_tail_ratio: Input should be"),
        (
            {**_raw(), "shape": {"latency_model": {"tpot_ms": float("nan")}}},
            "shape.latency_model.tpot_ms: Input should be a finite number",
        ),
        ({**_raw(), "decision": {"trt_max_models": 3}}, "unknown key decision.trt_max_models"),
        (
            {**_raw(), "prefix": {"reuse_age_buckets_s": [600, 60]}},
            "reuse_age_buckets_s must be strictly ascending",
        ),
        ({**_raw(), "prefix": {"block_size": True}}, "prefix.block_size"),
    ],
)
def test_bad_settings_name_the_file_and_key(
    raw: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ENGINEFIT_HASH_SALT", raising=False)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_salt_from_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEFIT_HASH_SALT", "from-env")
    cfg = config_from_mapping(_raw(hash_salt="in-file"))
    assert cfg.workload is not None
    assert cfg.workload.hash_salt == "from-env"
    assert "from-env" not in cfg.workload.salt_fingerprint


def test_sections_are_immutable_and_replace_validates() -> None:
    shape = default_config().shape
    with pytest.raises(ValidationError, match="frozen"):
        shape.long_tail_ratio = 5  # type: ignore[misc]
    assert shape.replace(long_tail_ratio=5.0).long_tail_ratio == 5.0
    with pytest.raises(ValidationError, match="greater than 1"):
        shape.replace(long_tail_ratio=0.5)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("workload:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(latin)
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)


def test_bundled_configuration_loads() -> None:
    cfg = load_config(REPO / "enginefit.yaml")
    assert cfg.workload is not None and cfg.workload.name == "mooncake-conversation"
    assert cfg.simulation.block_sizes == (512,)


def test_config_command_prints_every_setting_but_never_the_salt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump({**_raw(hash_salt="a-secret-salt"), "shape": {"long_tail_ratio": 5.0}})
    )
    assert main(["config", "--config", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert set(printed) == {
        "source",
        "workload",
        "paths",
        "shape",
        "prefix",
        "simulation",
        "bench",
        "capacity",
        "requirements",
        "decision",
        "report",
        "loadtest",
        "whatif",
    }
    assert printed["shape"]["long_tail_ratio"] == 5.0
    assert printed["capacity"]["headroom"] == 0.8
    assert printed["bench"]["slo"]["ttft_p95_ms"] == 1000.0
    assert "a-secret-salt" not in out + err
    assert (
        printed["workload"]["hash_salt_fingerprint"] == load_config(path).workload.salt_fingerprint
    )  # type: ignore[union-attr]
    assert err.startswith(f"enginefit config: configuration: {path} (workload w)")


def test_the_example_configuration_loads_and_names_every_option() -> None:
    """docs/enginefit.example.yaml is the README's "every option" configuration: it must stay
    valid and complete as options are added."""
    example = REPO / "docs" / "enginefit.example.yaml"
    load_config(example)

    def keys(mapping: dict[str, object], prefix: str = "") -> set[str]:
        out = set()
        for key, value in mapping.items():
            out.add(prefix + key)
            if isinstance(value, dict) and key not in (
                "gpu_hour_usd",
                "slo",
                "kv_cache",
                "cache_aware",
                "scenarios",
            ):
                out |= keys(value, f"{prefix}{key}.")
        return out

    defaults = yaml.safe_load((REPO / "pipeline" / "defaults.yaml").read_text())
    assert keys(defaults) <= keys(yaml.safe_load(example.read_text()))


def test_yaml_1_2_numbers_are_numbers(tmp_path: Path) -> None:
    """``1e2`` and ``1e-9`` are floats in YAML 1.2 (PyYAML's YAML 1.1 read them as text and
    the key then failed with "got '1e2'"); integers stay integers and quoted numbers text."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "workload: {name: w, traces: [t.jsonl], hash_salt: s}\n"
        "shape:\n  long_tail_ratio: 1e2\n  latency_model: {ttft_per_prompt_token_ms: 1e-9,"
        " tpot_ms: 2.5E1, ttft_base_ms: 50}\n"
    )
    cfg = load_config(cfg_file)
    assert cfg.shape.long_tail_ratio == 100.0
    assert cfg.shape.latency.ttft_per_prompt_token_ms == 1e-9
    assert cfg.shape.latency.tpot_ms == 25.0
    assert parse_yaml("a: 1e3\nb: 7\nc: '1e3'\nd: 2026-01-01") == {
        "a": 1000.0,
        "b": 7,
        "c": "1e3",
        "d": "2026-01-01",
    }
    assert isinstance(parse_yaml("n: 7")["n"], int)


def test_a_sections_own_parser_is_listed_with_the_other_problems(tmp_path: Path) -> None:
    """The SLO, prices and cache-aware parsers stopped validation at their error; now every
    problem is listed, each naming its key."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "workload: {name: w, traces: [t.jsonl], hash_salt: s}\n"
        "shape: {long_tail_ratio: abc}\n"
        "bench: {slo: [1], prices: {gpu_hour_usd: -1}}\n"
        "simulation: {cache_aware: 5}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(cfg_file)
    assert str(caught.value).splitlines() == [
        f"{cfg_file}: 4 problems:",
        "  - shape.long_tail_ratio: Input should be a valid number (got 'abc')",
        "  - bench.slo: must be a mapping of limits, got list",
        "  - bench.prices.gpu_hour_usd: a price is 0 to 1000 $ per GPU-hour, got -1",
        "  - simulation.cache_aware: must be a mapping with a preset",
    ]
