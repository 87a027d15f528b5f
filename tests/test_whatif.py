"""What-if scenarios and the decision map, on the whole stages of tests/decision_fixtures.py:
a fixed NVIDIA fleet serving one model, vLLM benchmarked at 5 req/s and TensorRT-LLM at 7 req/s,
a 20 req/s peak, engineers at $12,000 a week, $300 an hour (tests/test_decision_scenarios.py
works the costs by hand):

- vLLM: 4 replicas, $8,760 a month, plus n/3 × $600 (2 hours) for n model changes a quarter;
- TensorRT-LLM: 20/7 replicas' worth ($6,257.14 compared), 3 whole ($6,570 billed), plus
  n/3 × $1,200 (4 hours); a new deployment, so it must also pay back its extra engineer-week
  ($12,000) within 12 months.

At thirteen changes a quarter vLLM wins; the map must agree with the record's flips: TensorRT-LLM
below 5.95 changes ((8,760 + 200 n) − (6,570 + 400 n) ≥ 1,000 a month) and past ×1.662 today's
traffic (8,760 k + 2,600 ≥ 1.1 × (6,257.14 k + 5,200), k ≥ 3,120 ÷ 1,877.14).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.cli import main
from pipeline.commands.decision import configured_inputs as decision_configured_inputs
from pipeline.commands.whatif import configured_inputs as whatif_configured_inputs
from pipeline.config import Config, config_from_mapping, load_config
from pipeline.decision.compute import decided
from pipeline.decision.flips import moved
from pipeline.decision.result import AxisFlip, DecisionRecord
from pipeline.errors import ConfigError
from pipeline.whatif.compute import WhatifInputs, decision_map, scenario, today_context, whatif
from pipeline.whatif.config import MapAxis, ScenarioChanges
from pipeline.whatif.present import changes_text, label_cell, map_reading, map_svg
from pipeline.whatif.result import WhatifResult
from tests.decision_fixtures import (
    AS_OF,
    GPU_HOUR_USD,
    configuration,
    decide_on,
    steady_traffic,
    sweep,
)
from tests.test_decision_ranking_expert import bench, hand_context
from tests.test_decision_scenarios import one_stable_model

REQUIREMENTS = {**one_stable_model(changes_per_quarter=13), "engineer_week_usd": 12_000}


@pytest.fixture(scope="module")
def churn_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DecisionRecord]:
    root = tmp_path_factory.mktemp("churn")
    benches = [sweep("vllm", 5), sweep("tensorrt-llm", 7, backend="pytorch")]
    return root, decide_on(root, steady_traffic(), benches, REQUIREMENTS)


def churn_configuration(root: Path) -> Config:
    return configuration(root, REQUIREMENTS, results=sorted((root / "bench-results").iterdir()))


@pytest.fixture(scope="module")
def churn(churn_root: tuple[Path, DecisionRecord]) -> tuple[DecisionRecord, WhatifInputs]:
    root, record = churn_root
    cfg = churn_configuration(root)
    inputs = decision_configured_inputs(cfg)
    return record, WhatifInputs(inputs, cfg.requirements, cfg.decision)


def run(churn: Any, **changes: Any) -> tuple[Any, DecisionRecord]:
    today, inputs = churn
    return scenario("s", today_context(inputs), today, ScenarioChanges(**changes))


def axis(name: str, *values: float) -> MapAxis:
    """A two-point axis: the map then decides at exactly these values."""
    low, high = sorted(values)
    return MapAxis(axis=name, start=low, stop=high, points=2, log=False)


def test_a_scenario_that_changes_nothing_reproduces_today_exactly(churn: Any) -> None:
    today, _ = churn
    outcome, record = run(churn)
    assert record.model_dump(mode="json") == today.model_dump(mode="json")
    assert (outcome.engine, outcome.against_today, outcome.approximations) == ("vllm", [], [])
    assert outcome.monthly_cost_usd == 8_760  # 4 replicas × $3 × 730 h


def test_ten_times_the_traffic_moves_a_fixed_sku_team_to_tensorrt_llm(churn: Any) -> None:
    """A 200 req/s peak: vLLM 40 × $2,190 = $87,600 + $2,600 = $90,200; TensorRT-LLM
    200/7 × $2,190 = $62,571.43 + $5,200 = $67,771.43 compared (25 % cheaper, past the 10 %
    band), billed 29 whole replicas = $63,510 (+ $5,200 = $68,710): its extra engineer-week
    pays back in 12,000 ÷ 21,490 = 0.6 months."""
    outcome, record = run(churn, traffic_scale=10)
    assert (outcome.engine, outcome.runner_up, outcome.confidence) == (
        "tensorrt-llm",
        "vllm",
        "provisional",  # the benchmarks' own figures (no capacity stage here)
    )
    assert outcome.monthly_cost_usd == 63_510
    assert outcome.monthly_total_usd == pytest.approx(68_710)
    vllm = next(c for c in record.candidates if c.engine == "vllm")
    assert vllm.monthly_total_usd == pytest.approx(90_200)
    assert "engine: vLLM → TensorRT-LLM" in outcome.against_today
    assert "runner-up: TensorRT-LLM → vLLM" in outcome.against_today
    assert "monthly GPU cost: $8,760 → $63,510" in outcome.against_today
    assert outcome.approximations[0].startswith("traffic: arrivals closer in time")


def test_adding_amd_excludes_the_nvidia_only_engine(churn: Any) -> None:
    """Half a change a quarter: TensorRT-LLM wins ($6,257.14 + $200 against $8,760 + $100; its
    extra week paid back by $2,090 a month in 5.7 months); with AMD in the fleet too (one
    engine across it, the default) it runs on only part of it and is out: vLLM."""
    before, _ = run(churn, model_changes_per_quarter=0.5)
    after, record = run(churn, model_changes_per_quarter=0.5, hardware=["nvidia", "amd"])
    assert before.engine == "tensorrt-llm"
    assert after.engine == "vllm"
    trt = next(c for c in record.candidates if c.engine == "tensorrt-llm")
    assert trt.status == "excluded"
    assert trt.reasons[0].startswith("hardware: runs on nvidia")


def test_a_new_deployment_and_a_gpu_price_per_type(churn: Any) -> None:
    """H100s at $9 an hour (3×): GPU time outweighs the change costs, TensorRT-LLM wins (the
    record's GPU-price flip is ×1.662); no engine running today changes nothing else."""
    outcome, _ = run(churn, gpu_hour_usd={"H100": 9.0}, current_engine="none")
    assert outcome.engine == "tensorrt-llm"
    assert outcome.monthly_cost_usd == 3 * 9 * 730  # 3 replicas × 1 GPU × $9 × 730 h


def test_longer_outputs_without_a_capacity_split_scale_as_decode(churn: Any) -> None:
    outcome, record = run(churn, output_length_scale=2)
    assert any("decode-bound" in note for note in outcome.approximations)
    vllm = next(c for c in record.candidates if c.engine == "vllm")
    # capacity 5 → 2.5 req/s: 8 replicas; the cost per output token unchanged.
    assert vllm.monthly_cost_usd == 8 * 2_190
    today = next(c for c in churn[0].candidates if c.engine == "vllm")
    assert vllm.cost_per_1m_output_usd == pytest.approx(today.cost_per_1m_output_usd)


def test_todays_cell_equals_the_decision(churn: Any) -> None:
    today, inputs = churn
    found = decision_map(
        today_context(inputs),
        today,
        MapAxis(axis="traffic", start=0.5, stop=2, points=3, log=True),
        axis("model_changes", 12, 14).model_copy(update={"points": 3}),
    )
    assert found.x.values[1] == pytest.approx(1.0) and found.y.values[1] == 13
    assert (found.x.today, found.y.today) == (1.0, 13)
    assert found.cells[1][1] == today.recommendation.engine == "vllm"
    assert found.ties[1][1] is (today.recommendation.confidence == "tie")
    assert found.decisions == 9


def flip_of(record: DecisionRecord, axis_name: str, direction: str) -> AxisFlip:
    return next(f for f in record.flips if (f.axis, f.direction) == (axis_name, direction))


def straddle(flip: AxisFlip) -> tuple[float, float]:
    """Just short of the flip (toward today: today's answer) and at it (the flip's engine),
    the bisection's precision (1e-4) apart."""
    toward_today = -1 if flip.direction == "up" else 1
    return flip.threshold * (1 + toward_today * 2e-4), flip.threshold


@pytest.mark.parametrize(
    ("flip_axis", "direction", "map_axis", "factor"),
    [
        ("volume", "up", "traffic", True),
        ("model_changes", "down", "model_changes", False),
        ("gpu_price", "up", "gpu_price", True),
    ],
)
def test_each_flip_lies_on_a_map_boundary(
    churn: Any, flip_axis: str, direction: str, map_axis: str, factor: bool
) -> None:
    today, inputs = churn
    flip = flip_of(today, flip_axis, direction)
    before, at = straddle(flip)
    if factor:
        before, at = before / flip.today, at / flip.today
    other = "model_changes" if map_axis != "model_changes" else "traffic"
    other_today = 13.0 if other == "model_changes" else 1.0
    found = decision_map(
        today_context(inputs),
        today,
        axis(map_axis, before, at),
        axis(other, other_today, other_today * 1.0001),
    )
    row = [found.cells[0][i] for i in range(2)]
    values = found.x.values
    assert dict(zip(values, row, strict=True)) == {
        before: today.recommendation.engine,
        at: flip.engine,
    }
    mark = next(m for m in found.marks if m.id == f"{flip_axis}.{direction}")
    assert (mark.axis, mark.engine) == ("x", flip.engine)
    assert mark.value == pytest.approx(at)


def test_the_prefix_share_flip_lies_on_a_map_boundary() -> None:
    """vLLM and SGLang within the 10 % band (5 and 5.2 req/s): a tie the decision tree's order
    breaks. Little sharing: vLLM; past a 50 % shared-prefix share the tree points to SGLang
    first."""
    base = hand_context([bench("vllm", 5), bench("sglang", 5.2)])
    today = decided(moved(base))
    flip = flip_of(today, "prefix_share", "up")
    assert flip.threshold == pytest.approx(0.5, abs=1e-4)
    before, at = straddle(flip)
    found = decision_map(base, today, axis("prefix_share", before, at), axis("traffic", 1, 2))
    assert [found.cells[0][0], found.cells[0][1]] == ["vllm", "sglang"]
    assert found.ties[0] == [True, True]
    assert today.recommendation.confidence == "tie"
    mark = next(m for m in found.marks if m.id == "prefix_share.up")
    assert mark.value == pytest.approx(at)


def test_the_default_map_and_the_result_round_trip(churn: Any) -> None:
    """The configured 40 × 27 grid; the volume flip at ×1.662 and the model-changes flip at
    5.95 a quarter are where the map changes colour along today's row and column."""
    _, inputs = churn
    cfg = config_from_mapping(
        {"whatif": {"scenarios": {"double": {"traffic_scale": 2}, "none": {}}}}
    )
    result = whatif(inputs, cfg.whatif)
    found = result.map
    assert found is not None
    assert (len(found.x.values), len(found.y.values), found.decisions) == (40, 27, 1_080)
    assert [s.name for s in result.scenarios] == ["double", "none"]
    row13 = found.cells[13]  # 13 model changes a quarter
    first_trt = next(i for i, e in enumerate(row13) if e == "tensorrt-llm")
    assert found.x.values[first_trt - 1] < 3_120 / 1_877.14 <= found.x.values[first_trt]
    assert set(row13[:first_trt]) == {"vllm"}
    # ×0.25 traffic: both need one replica, so TensorRT-LLM's extra week never pays back.
    assert {row[0] for row in found.cells} == {"vllm"}
    again = WhatifResult.from_json(result.to_json())
    assert again == result


def test_the_whatif_section_is_strict() -> None:
    with pytest.raises(ConfigError, match=r"whatif\.scenarios\.x\.traffic_scal"):
        config_from_mapping({"whatif": {"scenarios": {"x": {"traffic_scal": 2}}}})
    with pytest.raises(ConfigError, match="must be above start"):
        config_from_mapping({"whatif": {"map": {"x": {"axis": "traffic", "start": 2, "stop": 1}}}})
    with pytest.raises(ConfigError, match=r"whatif\.scenarios\.x\.current_engine"):
        config_from_mapping({"whatif": {"scenarios": {"x": {"current_engine": "nginx"}}}})


def test_the_bundled_examples_parse() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in (root / "enginefit.yaml", root / "docs" / "enginefit.example.yaml"):
        scenarios = load_config(path).whatif.scenarios
        assert scenarios, path


@pytest.fixture(scope="module")
def configured(churn_root: tuple[Path, DecisionRecord]) -> tuple[Path, DecisionRecord]:
    """The churn workload's configuration as a file, with two scenarios."""
    root, today = churn_root
    results = sorted((root / "bench-results").iterdir())
    written = {
        "workload": {"name": "w", "traces": ["unused.jsonl"], "hash_salt": "s"},
        "paths": {"data_dir": str(root / "data"), "reports_dir": str(root / "reports")},
        "bench": {
            "as_of": AS_OF,
            "prices": {"gpu_hour_usd": {"default": GPU_HOUR_USD}},
            "results": [str(r) for r in results],
        },
        "requirements": REQUIREMENTS,
        "whatif": {"scenarios": {"x10": {"traffic_scale": 10}, "same": {}}},
    }
    path = root / "whatif.yaml"
    path.write_text(yaml.safe_dump(written))
    return path, today


def test_the_command_prints_scenarios_and_the_map(
    configured: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = configured
    assert main(["whatif", "--config", str(path), "--scenario", "x10", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in printed["scenarios"]] == ["x10"]
    assert printed["scenarios"][0]["engine"] == "tensorrt-llm"
    assert len(printed["map"]["cells"]) == 27 and len(printed["map"]["cells"][0]) == 40
    assert main(["whatif", "--config", str(path), "--map", "traffic,gpu_price"]) == 0
    text = capsys.readouterr().out
    assert "same (nothing):" in text and "against today: the same decision" in text
    assert "decision map: traffic (× today's traffic) across, gpu_price" in text
    written = json.loads((path.parent / "data" / "w" / "whatif" / "whatif.json").read_text())
    assert written["map"]["y"]["axis"] == "gpu_price"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "nope"], "--scenario: no scenario 'nope' in whatif.scenarios"),
        (["--map", "traffic"], "--map: give two axes as X,Y"),
        (["--map", "traffic,volume"], "--map: no axis 'volume'; the axes are traffic"),
        (["--map", "traffic,traffic"], "x and y are both 'traffic'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    configured: Any, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    path, _ = configured
    assert main(["whatif", "--config", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    assert not any("Traceback" in line for line in err)


def test_the_map_figure_is_deterministic_and_labels_each_region(churn: Any) -> None:
    _, inputs = churn
    cfg = config_from_mapping({})
    found = whatif(inputs, cfg.whatif).map
    assert found is not None
    first, second = map_svg(found), map_svg(found)
    assert first == second and first.startswith(b"<?xml")
    for engine in found.engines:
        i, j = label_cell(found, engine)
        assert found.cells[j][i] == engine
    # vLLM's label sits inside its region, away from its edge: its neighbours are vLLM too.
    i, j = label_cell(found, "vllm")
    assert {found.cells[j][i - 1], found.cells[j][i + 1], found.cells[j + 1][i]} == {"vllm"}


def test_the_map_reads_in_one_sentence(churn: Any) -> None:
    _, inputs = churn
    found = whatif(inputs, config_from_mapping({}).whatif).map
    assert found is not None
    assert map_reading(found) == (
        "We are here: vLLM at ×1 today's traffic and 13 model changes a quarter. "
        "TensorRT-LLM takes over past ×1.66 today's traffic. "
        "TensorRT-LLM takes over below 5.95 model changes a quarter."
    )
    assert changes_text({"traffic_scale": 2.0, "hardware": ["nvidia", "amd"]}) == (
        "traffic scale 2, hardware nvidia + amd"
    )


def test_a_tighter_slo_reruns_the_benchmarks_in_memory(configured: Any) -> None:
    """p95 TTFT ≤ 500 ms: each sweep's point at c (800 ms) now fails, so capacity is its ½ c
    point (300 ms). vLLM at 2.5 req/s: 8 replicas, $17,520 + $2,600 = $20,120; TensorRT-LLM at
    3.5: 20/3.5 × $2,190 = $12,514.29 + $5,200 = $17,714.29 compared (13.6 % apart), 6 whole
    replicas billed ($13,140 + $5,200): its extra week pays back in 12,000 ÷ 1,780 = 6.7
    months. Nothing is written: today's bench outputs stay."""
    path, today = configured
    raw = yaml.safe_load(path.read_text())
    raw["whatif"]["scenarios"] = {"strict": {"slo": {"ttft_p95_ms": 500}}}
    cfg = config_from_mapping(raw, source=path)
    written = (cfg.layout().bench.capacity).read_bytes()
    inputs = whatif_configured_inputs(cfg)
    base = today_context(replace(inputs, decision=inputs.at_slo["strict"]))
    changes = cfg.whatif.scenarios["strict"]
    outcome, record = scenario("strict", base, today, changes)
    costs = {c.engine: (c.monthly_cost_usd, c.monthly_total_usd) for c in record.candidates}
    assert costs["vllm"] == (17_520, pytest.approx(20_120))
    assert costs["tensorrt-llm"] == (13_140, pytest.approx(18_340))
    assert (outcome.engine, outcome.confidence) == ("tensorrt-llm", "provisional")
    assert outcome.approximations[0].startswith("SLO: the bench stage's capacity at the SLO")
    assert cfg.layout().bench.capacity.read_bytes() == written
    result = whatif(inputs, cfg.whatif, with_map=False)
    assert [(s.name, s.engine) for s in result.scenarios] == [("strict", "tensorrt-llm")]


def test_a_scenario_slo_is_checked_when_the_configuration_loads() -> None:
    with pytest.raises(ConfigError, match=r"whatif\.scenarios\.x\.slo"):
        config_from_mapping({"whatif": {"scenarios": {"x": {"slo": {"ttft_p42_ms": 5}}}}})
