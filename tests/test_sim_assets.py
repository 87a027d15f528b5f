"""The simulation assets materialise on a tiny workload and their outputs agree with each other."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from assets.resources import EnginefitStore
from assets.sim import ASSETS, CHECKS
from pipeline.sim import blocks, stage
from tests.conftest import write_requests
from tests.workloads import growing_conversations


def _setup(tmp_path: Path) -> Path:
    frame = growing_conversations(60, 6, extra_tokens=3, output_tokens=20)
    write_requests(frame, tmp_path / "data" / "t")
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        f"""
workload:
  name: t
  traces: [unused.jsonl]
  block_size: 16
  hash_salt: test-salt
paths: {{data_dir: {tmp_path / "data"}, reports_dir: {tmp_path / "reports"}}}
simulation:
  block_sizes: [16, 32]
  replicas: [1, 3]
  cache_tokens: [64, 100000]
  routings: [round-robin, affinity, cache-aware]
"""
    )
    return config


def test_assets_materialise_and_agree(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    result = dg.materialize(
        [*ASSETS, *CHECKS], resources={"store": EnginefitStore(config_path=str(config))}
    )
    assert result.success
    out = tmp_path / "data" / "t" / "simulation"
    scenarios = pl.read_parquet(out / "scenarios.parquet")
    # 2 block sizes × 2 capacities × (1 single + 3 routings at R=3)
    assert scenarios.height == 16
    assert scenarios["scenario"].is_sorted()
    per_step = sorted(p.name for p in (out / "scenarios").glob("*.json"))
    assert len(per_step) == 16
    checks = result.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks)
    big = scenarios.filter(pl.col("cache_tokens") == 100000, pl.col("block_size") == 16)
    single = big.filter(pl.col("replicas") == 1)["hit_tokens"].item()
    assert (
        big.filter(pl.col("routing") == "affinity", pl.col("replicas") == 3)["hit_tokens"].item()
        == single
    )
    curves = pl.read_parquet(out / "curves.parquet")
    assert set(curves["routing"].unique()) == {"single", "round-robin", "affinity"}
    assert (out / "hit_ratio_vs_capacity.svg").read_bytes().startswith(b"<?xml")
    assert json.loads((out / "curves.json").read_text())[0]["exact"] is True


def test_outputs_are_deterministic(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    store = EnginefitStore(config_path=str(config))
    out = tmp_path / "data" / "t" / "simulation"
    assert dg.materialize(ASSETS, resources={"store": store}).success
    first = {p.name: p.read_bytes() for p in out.glob("*.*")}
    assert dg.materialize(ASSETS, resources={"store": store}).success
    second = {p.name: p.read_bytes() for p in out.glob("*.*")}
    assert first == second


def test_a_run_flattens_numbers_and_infers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every scenario step and the curves share one flattened table, its dense block ids per
    block size and its sessions (worked out only because affinity scenarios need them)."""
    config = _setup(tmp_path)
    calls: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(stage, "sim_input", counted("sim_input", stage.sim_input))
    monkeypatch.setattr(blocks, "dense_ids", counted("dense_ids", blocks.dense_ids))
    monkeypatch.setattr(blocks, "_sessions", counted("sessions", blocks._sessions))
    store = EnginefitStore(config_path=str(config))
    assert dg.materialize(ASSETS, resources={"store": store}).success
    # 2 block sizes; 16 scenario steps and 6 curves
    assert calls == {"sim_input": 1, "dense_ids": 2, "sessions": 1}


def test_round_robin_never_infers_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _setup(tmp_path)
    text = config.read_text().replace("[round-robin, affinity, cache-aware]", "[round-robin]")
    config.write_text(text)
    monkeypatch.setattr(blocks, "_sessions", _never)
    assert dg.materialize(
        ASSETS, resources={"store": EnginefitStore(config_path=str(config))}
    ).success


def _never(*args: Any) -> Any:
    raise AssertionError("sessions were inferred")


def test_a_table_past_the_flattening_limit_streams_every_scenario_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``curve_exact_max_blocks`` the scenarios stream in one step and the curves are
    sampled part by part: nothing flattens the whole table, and the scenario tables are the
    flattened run's to the byte."""
    flat_config = _setup(tmp_path / "flat")
    assert dg.materialize(
        ASSETS, resources={"store": EnginefitStore(config_path=str(flat_config))}
    ).success
    config = _setup(tmp_path / "streamed")
    # past the limit at once, sampled at half (a sample that keeps blocks, to check against)
    config.write_text(
        config.read_text() + "  curve_exact_max_blocks: 0\n  curve_sample_rate: 0.5\n"
    )
    flattened: list[object] = []
    monkeypatch.setattr(stage, "sim_input", lambda *a, **k: flattened.append(a))
    result = dg.materialize(
        [*ASSETS, *CHECKS], resources={"store": EnginefitStore(config_path=str(config))}
    )
    assert result.success and flattened == []
    # the replays agree with the sampled curves within their stated error
    assert [c.passed for c in result.get_asset_check_evaluations()] == [True]
    steps = {e.step_key for e in result.all_events if e.step_key}
    assert [k for k in steps if k.startswith("simulation_scenarios.sim_scenario")] == [
        "simulation_scenarios.sim_scenario[every_scenario]"
    ]
    flat, streamed = (
        p / "data" / "t" / "simulation" for p in (tmp_path / "flat", tmp_path / "streamed")
    )
    for name in ("scenarios.parquet", "replicas.parquet", "scenarios.json"):
        assert (streamed / name).read_bytes() == (flat / name).read_bytes(), name
    assert sorted(p.name for p in (streamed / "scenarios").glob("*.json")) == sorted(
        p.name for p in (flat / "scenarios").glob("*.json")
    )
    sampled = json.loads((streamed / "curves.json").read_text())
    assert sampled and not any(point["exact"] for point in sampled)
