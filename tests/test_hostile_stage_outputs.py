"""Hostile stage outputs: a file an earlier stage wrote that exists but cannot be read (random
bytes, JSON nested past any depth, a truncated table, a table damaged where its footer
survives) is an error naming the file and the command that rewrites it. It is never taken for
a stage that has not run, so the decision and the what-if never change silently. An output its
stage seals found without its seal cannot be trusted either."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import outdated_assets
from pipeline import results
from pipeline.cli import main as enginefit
from pipeline.commands.decision import configured_inputs as decision_configured_inputs
from pipeline.commands.whatif import configured_inputs as whatif_configured_inputs
from pipeline.config import Config, load_config
from pipeline.decision.stage import published_previous
from pipeline.errors import InputFormatError, StageOutputUnreadableError
from pipeline.layout import WorkloadLayout
from tests.conftest import write_config
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


def _forge_seal(result: results.Result, config: Config) -> None:
    """Seal ``result``'s files as they are now (the inputs it recorded kept): damage whose
    seal was rewritten to match."""
    layout = config.layout()
    recorded = json.loads(result.seal_path(layout).read_text()).get("inputs")
    result.seal(layout, inputs=recorded)


def test_an_output_without_its_seal_is_the_stage_to_re_run(
    workload: tuple[Config, Path],
) -> None:
    """Written by an enginefit before seals, or its seal deleted: what it holds cannot be
    trusted, however well it parses."""
    config, data = workload
    (data / "shape" / ".workload_shape.sha256.json").unlink()
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value) == (
        f"{data / 'shape' / 'workload_shape.json'}: no .workload_shape.sha256.json beside it (an "
        "earlier enginefit wrote it, or its seal was removed), so what it holds cannot be "
        "trusted: the workload shape cannot be read; " + rerun("shape", "workload_shape")
    )


def test_an_unreadable_output_with_a_forged_seal_is_never_missing(
    workload: tuple[Config, Path],
) -> None:
    """Its seal rewritten to match the damage: parsing still refuses it."""
    config, data = workload
    target = data / "shape" / "workload_shape.json"
    target.write_bytes(b"\xff\xfe" + bytes(range(200)))
    _forge_seal(results.SHAPE, config)
    with pytest.raises(StageOutputUnreadableError) as caught:
        decision_configured_inputs(config)
    assert str(caught.value) == (
        f"{target}: not UTF-8 text (byte 0 cannot be decoded); not a JSON file: the workload "
        "shape cannot be read; " + rerun("shape", "workload_shape")
    )


def test_deeply_nested_json_is_the_stage_to_re_run(workload: tuple[Config, Path]) -> None:
    config, data = workload
    target = data / "bench" / "bench_analysis.json"
    target.write_text("[" * 100_000 + "]" * 100_000)
    _forge_seal(results.BENCH, config)
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


def test_a_truncated_table_with_a_forged_seal_is_the_stage_to_re_run(
    workload: tuple[Config, Path],
) -> None:
    config, data = workload
    target = data / "simulation" / "curves.parquet"
    target.write_bytes(target.read_bytes()[:40])
    _forge_seal(results.CURVES, config)
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


def test_a_ledger_entry_for_a_version_that_does_not_exist_is_a_ghost_entry(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n' * 3
    )
    config = load_config(write_config(tmp_path, [str(trace)]))
    assert enginefit(["ingest", "--config", str(config.source)]) == 0
    tree = config.filing().tree
    _, folder = tree.publish("2025-Q1", 1, {"decision.json": b"{}\n"}, {"identity": "i"}, "vLLM")
    shutil.rmtree(folder)
    with pytest.raises(InputFormatError) as caught:
        published_previous(config.layout(), config.filing())
    assert str(caught.value) == (
        f"{tree.ledger}: a ghost entry: it lists version 2025-Q1/v1, but "
        f"{folder / 'decision.json'} does not exist (the version was moved or deleted); "
        "restore it, or name the record to compare with in decision.previous_record"
    )


def test_dagster_materialises_an_output_damaged_since_its_run_again(tmp_path: Path) -> None:
    """Dagster's history says the shape is fresh; its sealed output changed since (damaged
    on disk), so `enginefit decide` materialises it again, not reads it (or fails on it)."""

    @dg.asset(name="workload_shape")
    def shape() -> None:
        return None

    @dg.asset(name="workload_capacity", deps=[shape])
    def capacity() -> None:
        return None

    definitions = dg.Definitions(assets=[shape, capacity])
    keys = [dg.AssetKey("workload_shape"), dg.AssetKey("workload_capacity")]
    layout = WorkloadLayout(tmp_path / "w")
    summary = layout.shape.summary
    summary.parent.mkdir(parents=True)
    summary.write_text('{"schema_version": 1}\n')
    results.SHAPE.seal(layout)
    with dg.DagsterInstance.ephemeral() as instance:
        assert outdated_assets(instance, definitions, keys, layout) == keys  # never run
        assert dg.materialize([shape, capacity], instance=instance).success
        assert outdated_assets(instance, definitions, keys, layout) == []
        summary.write_bytes(bytes(range(256)))
        assert outdated_assets(instance, definitions, keys, layout) == [keys[0]]
        results.SHAPE.seal_path(layout).unlink()  # the seal gone: not to be trusted either
        summary.write_text('{"schema_version": 1}\n')
        assert outdated_assets(instance, definitions, keys, layout) == [keys[0]]
