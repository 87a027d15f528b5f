"""Hostile stage outputs: a file an earlier stage wrote that exists but cannot be read (random
bytes, JSON nested past any depth, a truncated table, a table damaged where its footer
survives) is an error naming the file and the command that rewrites it. It is never taken for
a stage that has not run, so the decision and the what-if never change silently."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.commands.decision import configured_inputs as decision_configured_inputs
from pipeline.commands.whatif import configured_inputs as whatif_configured_inputs
from pipeline.config import Config
from pipeline.errors import StageOutputUnreadableError
from tests.decision_fixtures import decide_on, steady_traffic, sweep
from tests.test_decision_scenarios import one_stable_model
from tests.test_whatif import churn_configuration

REQUIREMENTS = one_stable_model(changes_per_quarter=3)


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decided")
    benches = [sweep("vllm", 5), sweep("tensorrt-llm", 7, backend="tensorrt")]
    decide_on(root, steady_traffic(), benches, REQUIREMENTS)
    return root


@pytest.fixture
def workload(decided: Path, tmp_path: Path) -> tuple[Config, Path]:
    """A private copy of the decided workload: its configuration and its data folder."""
    root = tmp_path / "copy"
    shutil.copytree(decided, root)
    config = churn_configuration(root)
    return config, config.layout().root


def rerun(command: str, asset: str) -> str:
    return f"re-run `enginefit {command} --config FILE` (or materialise `{asset}`)"


def test_every_stage_output_the_decision_reads_is_sealed(workload: tuple[Config, Path]) -> None:
    _, data = workload
    seals = sorted(p.relative_to(data).as_posix() for p in data.rglob(".*.sha256.json"))
    assert seals == [
        "bench/.bench_analysis.sha256.json",
        "bench/.bench_load_points.sha256.json",
        "bench/.concurrency_by_engine.sha256.json",
        "decision/.engine_decision.sha256.json",
        "decision/.revisit_triggers.sha256.json",
        "prefix/.prefix_sharing.sha256.json",
        "shape/.workload_shape.sha256.json",
        "simulation/.simulation_curves.sha256.json",
        "simulation/.simulation_plots.sha256.json",
        "simulation/.simulation_scenarios.sha256.json",
    ]


def test_random_bytes_over_a_sealed_output_name_the_file_and_the_stage(
    workload: tuple[Config, Path],
) -> None:
    config, data = workload
    target = data / "shape" / "workload_shape.json"
    target.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value) == (
        f"{target}: changed since `enginefit shape` wrote it (its sha256 differs from the one "
        "in .workload_shape.sha256.json): the workload shape cannot be read; "
        + rerun("shape", "workload_shape")
    )


def test_an_unsealed_unreadable_output_is_never_missing(workload: tuple[Config, Path]) -> None:
    """Written before seals existed (or its seal deleted): parsing still refuses it."""
    config, data = workload
    target = data / "shape" / "workload_shape.json"
    (data / "shape" / ".workload_shape.sha256.json").unlink()
    target.write_bytes(b"\xff\xfe" + bytes(range(200)))
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value) == (
        f"{target}: not UTF-8 text (byte 0 cannot be decoded); not a JSON file: the workload "
        "shape cannot be read; " + rerun("shape", "workload_shape")
    )


def test_deeply_nested_json_is_the_stage_to_re_run(workload: tuple[Config, Path]) -> None:
    config, data = workload
    target = data / "bench" / "bench_analysis.json"
    (data / "bench" / ".bench_analysis.sha256.json").unlink()
    target.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value) == (
        f"{target}: nested more than 200 levels deep; not a file enginefit reads: the bench "
        "analysis cannot be read; " + rerun("bench", "bench_analysis")
    )


def test_a_table_damaged_behind_an_intact_footer_is_caught_by_its_seal(
    workload: tuple[Config, Path],
) -> None:
    config, data = workload
    target = data / "simulation" / "curves.parquet"
    raw = bytearray(target.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 8] = bytes(8) if raw[middle : middle + 8] != bytes(8) else b"\xff" * 8
    target.write_bytes(bytes(raw))
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value).startswith(f"{target}: changed since `enginefit simulate` wrote it")
    assert str(caught.value).endswith(rerun("simulate", "simulation_curves"))


def test_a_truncated_unsealed_table_is_the_stage_to_re_run(
    workload: tuple[Config, Path],
) -> None:
    config, data = workload
    target = data / "simulation" / "curves.parquet"
    (data / "simulation" / ".simulation_curves.sha256.json").unlink()
    target.write_bytes(target.read_bytes()[:40])
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value).startswith(f"{target}: ")
    assert str(caught.value).endswith(
        "the capacity curves cannot be read; " + rerun("simulate", "simulation_curves")
    )


def test_the_what_if_refuses_a_damaged_output_too(workload: tuple[Config, Path]) -> None:
    config, data = workload
    target = data / "prefix" / "prefix_sharing.json"
    target.write_text('{"schema_version": 1}')
    with pytest.raises(StageOutputUnreadableError) as caught:
        whatif_configured_inputs(config)
    assert str(caught.value).startswith(f"{target}: changed since `enginefit prefix` wrote it")


def test_a_stage_that_never_ran_is_still_missing_not_an_error(
    workload: tuple[Config, Path],
) -> None:
    config, data = workload
    shutil.rmtree(data / "prefix")
    inputs = decision_configured_inputs(config)
    assert inputs.prefix is None
    assert inputs.missing["prefix"].startswith(
        f"{data / 'prefix' / 'prefix_sharing.json'}: no prefix analysis; run `enginefit prefix"
    )
