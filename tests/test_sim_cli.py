"""``enginefit simulate`` / ``enginefit curve`` on a small canonical Parquet workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import config_from_mapping
from pipeline.errors import ConfigError
from tests.conftest import DEFAULTS, write_requests
from tests.workloads import growing_conversations


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    frame = growing_conversations(40, 5, extra_tokens=3, output_tokens=5)
    write_requests(frame, tmp_path / "wl")
    return tmp_path / "wl"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(argv) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_simulate_json(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", str(workload), "--block-size", "16", "--cache-tokens", "120000", "--json"]
    single = run(base, capsys)
    # every turn after the first hits all its previous blocks: turn t hits 16·t tokens
    assert single["hit_tokens"] == 5 * sum(16 * t for t in range(8))
    assert single["prompt_tokens"] == sum(16 * (i // 5 + 1) + 3 for i in range(40))
    # the config default lifetime is durations; --request-lifetime instant releases at arrival
    assert single["request_lifetime"]["mode"] == "durations"  # type: ignore[index]
    instant = run([*base, "--request-lifetime", "instant"], capsys)
    assert instant["request_lifetime"]["mode"] == "instant"  # type: ignore[index]
    assert instant["hit_tokens"] == single["hit_tokens_instant"]
    aff = run([*base, "--replicas", "4", "--routing", "affinity"], capsys)
    assert aff["hit_tokens"] == single["hit_tokens"]
    assert len(aff["per_replica"]) == 4  # type: ignore[arg-type]
    rr = run([*base, "--replicas", "4", "--routing", "round-robin"], capsys)
    assert rr["hit_tokens"] < single["hit_tokens"]  # type: ignore[operator]
    for routing in ("random", "least-loaded", "least-served", "bounded-affinity", "cache-aware"):
        out = run([*base, "--replicas", "4", "--routing", routing], capsys)
        assert out["routing"] == routing and 0 <= out["hit_ratio"] <= 1  # type: ignore[operator]


def test_curve_json(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["curve", str(workload), "--block-size", "16", "--json"], capsys)
    assert out["max_hit_tokens"] == 5 * sum(16 * t for t in range(8))
    points = out["points"]
    assert isinstance(points, list)
    ratios = [p["hit_ratio"] for p in points]
    assert ratios == sorted(ratios)
    out4 = run(
        [
            "curve",
            str(workload),
            "--block-size",
            "16",
            "--replicas",
            "4",
            "--routing",
            "affinity",
            "--json",
        ],
        capsys,
    )
    assert out4["max_hit_tokens"] == out["max_hit_tokens"]


def test_curve_refuses_cache_aware(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "curve",
        str(workload),
        "--block-size",
        "16",
        "--replicas",
        "2",
        "--routing",
        "cache-aware",
    ]
    assert main(argv) == 2
    assert "cache state" in capsys.readouterr().err


def test_block_size_must_be_a_multiple(workload: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", str(workload), "--block-size", "24", "--cache-tokens", "100"]
    assert main(argv) == 2
    assert "multiple" in capsys.readouterr().err


def simulation_section(raw: dict[str, object]) -> object:
    return config_from_mapping({"simulation": raw}).simulation


def test_config_section_validation() -> None:
    cfg = config_from_mapping(
        {"simulation": {"replicas": [1, 2], "routings": ["random", "cache-aware"]}}
    ).simulation
    assert [s.key for s in cfg.scenarios()][:2] == [
        "b16_r1_c1000000_random",
        "b16_r1_c4000000_random",
    ]
    assert cfg.cache_aware.balance_rel_threshold == 1.1
    for raw, message in (
        ({"routings": ["sticky"]}, "simulation.routings[0]: Input should be"),
        ({"replica": [1]}, "unknown key simulation.replica (did you mean replicas?)"),
        (
            {"cache_aware": {"preset": "library", "cache_threshold": 2}},
            "simulation.cache_aware: cache_threshold: Input should be less than or equal to 1",
        ),
    ):
        with pytest.raises(ConfigError) as caught:
            simulation_section(raw)
        assert message in str(caught.value)
    latency = DEFAULTS.shape.latency_model.replace(tpot_ms=10).model_dump()
    shaped = config_from_mapping({"simulation": {"latency_model": latency}})
    assert shaped.simulation.latency(shaped.shape.latency).tpot_ms == 10
    # null: the shape section's model
    assert DEFAULTS.simulation.latency(DEFAULTS.shape.latency) == DEFAULTS.shape.latency


def test_adhoc_flags_are_validated_like_the_configuration(
    workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", str(workload), "--block-size", "16", "--cache-tokens", "100"]
    assert main([*argv, "--seed", "-5"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "enginefit: error: --seed: Input should be greater than or equal to 0 (got '-5')"
    )
    assert main([*argv[:4]]) == 2
    assert "--cache-tokens is required with TRACE" in capsys.readouterr().err
