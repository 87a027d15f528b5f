"""The decision on the workload's own capacity and cost: the capacity stage's serving
model carried to the workload's mix replaces the benchmark's req/s and $/1M in the ranking, the
fleet, routing and the record, with the benchmark's figure kept beside it.

The serving model is fitted on the independent simulator's short-prompt sweep
(tests/capacity_scenarios.py: prompts 100-300 tokens); the decision's own benchmark is a
128-token sweep on one $3/h GPU, whose own cost per 1M output tokens is
the same whatever the workload.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import cache, partial
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from assets.cli import main as enginefit
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.result import ServingModel
from pipeline.decision.present import rationale_text
from pipeline.decision.result import DecisionRecord, record_schema
from pipeline.decision.stage import read_previous
from pipeline.decision.triggers import record_digest
from pipeline.report.sections.content import ReportContent
from pipeline.report.sections.workload_cost import workload_cost
from tests.capacity_scenarios import fitted
from tests.decision_fixtures import (
    GPU_HOUR_USD,
    candidate,
    capacity_of,
    configuration,
    sweep,
    traffic,
)
from tests.decision_fixtures import decide_on as decide_drawing_figures

# What these tests read is the decision, not the stages' figures, which took most of each
# scenario's time to draw.
decide_on = partial(decide_drawing_figures, figures=False)

NVIDIA = {"deployment": "datacenter", "hardware": ["nvidia"]}


@cache
def model() -> ServingModel:
    fit = fitted("short")
    assert isinstance(fit, ServingModel), fit
    return fit


def steady(turn_blocks: int) -> object:
    """20 req/s, 1 s each, 200 output tokens, unique prompts of ``turn_blocks`` × 16 tokens."""
    return traffic(600, rate_rps=20, e2e_s=1.0, turn_blocks=turn_blocks)


def long_conversations() -> object:
    """Prefix-heavy and long: 41 conversations of 10 turns at 10 req/s over a 1,024-token system
    prompt, each turn adding 512 tokens (prompts 1.5k-6.1k tokens, mean about 3.8k)."""
    return traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64, turn_blocks=32)


def test_two_workloads_over_the_same_sweep_get_their_own_costs(tmp_path: Path) -> None:
    """128-token and 4,000-token prompts over the same benchmark: the benchmark's own figure is
    the same for both, the workload's is not, and the long prompts cost more per output token
    (each request spends far longer in prefill) and need more replicas."""
    short = decide_on(
        tmp_path / "short", steady(8), [sweep("vllm", 40)], NVIDIA, capacity=capacity_of(model())
    )
    long = decide_on(
        tmp_path / "long", steady(250), [sweep("vllm", 40)], NVIDIA, capacity=capacity_of(model())
    )
    a, b = candidate(short, "vllm"), candidate(long, "vllm")
    bench_cost = a.benchmark_cost_per_1m_output_usd
    assert bench_cost is not None
    for c in (a, b):
        assert c.cost_basis == "workload" and c.capacity_basis == "transferred"
        assert c.benchmark_cost_per_1m_output_usd == bench_cost
        assert c.capacity_rps == a.capacity_rps is not None  # the benchmark's, beside it
        # Hand check: all-in = $3/h ÷ (capacity × 200 output tokens × 3600) × 10⁶.
        assert c.cost_per_1m_output_usd == pytest.approx(
            GPU_HOUR_USD / (c.workload_capacity_rps * 200 * 3600) * 1e6, rel=1e-3
        )
        low, high = c.workload_capacity_band_rps
        assert low <= c.workload_capacity_rps <= high
    for record, c in ((short, a), (long, b)):
        # Replicas at the workload's peak with 80 % headroom, and their monthly bill.
        peak = record.measured("shape.arrivals.peak_rate_rps")
        assert c.replicas == max(1, math.ceil(peak / (c.workload_capacity_rps * 0.8)))
        assert c.monthly_cost_usd == pytest.approx(c.replicas * GPU_HOUR_USD * 730, rel=1e-4)
        # The band carried: the high capacity needs the fewer replicas, each priced the same way.
        low, high = c.workload_capacity_band_rps
        fewest = max(1, math.ceil(peak / (high * 0.8)))
        most = max(1, math.ceil(peak / (low * 0.8)))
        assert c.replicas_band == (fewest, most) and fewest <= c.replicas <= most
        assert c.monthly_cost_band_usd == pytest.approx(
            (fewest * GPU_HOUR_USD * 730, most * GPU_HOUR_USD * 730), rel=1e-4
        )
        assert c.cost_per_1m_output_band_usd == pytest.approx(
            (
                GPU_HOUR_USD / (high * 200 * 3600) * 1e6,
                GPU_HOUR_USD / (low * 200 * 3600) * 1e6,
            ),
            rel=1e-3,
        )
        assert c.capacity_band_basis and "validation error" in c.capacity_band_basis
        assert c.cost_per_1m_input_usd is not None and c.cost_per_1m_cached_input_usd is None
        assert c.transfer and c.transfer.startswith("Measured at")
    assert b.workload_capacity_rps < a.workload_capacity_rps / 5
    assert b.cost_per_1m_output_usd > 5 * a.cost_per_1m_output_usd
    assert b.replicas > a.replicas and b.monthly_cost_usd > a.monthly_cost_usd
    assert long.measured("decision.cost_per_1m_output_usd[vllm]") == pytest.approx(
        b.cost_per_1m_output_usd
    )
    assert long.measured("bench.cost_per_1m_output_usd[vllm]") == bench_cost
    assert "this workload" in long.recommendation.headline
    # 4,000-token prompts are 20× the fitted mix: far outside it, so provisional, and why.
    assert b.provisional_reason and "far outside the measured mix" in b.provisional_reason
    assert long.recommendation.confidence == "provisional"
    assert any(
        "capacity on this workload is provisional" in r
        for r in long.recommendation.confidence_reasons
    )
    cost_rule = next(r for r in long.rationale if r.rule == "cost")
    assert cost_rule.evidence["monthly_gpu_usd"] == {"vllm": pytest.approx(b.monthly_cost_usd)}


def test_routing_follows_the_workloads_fleet_not_the_benchmarks(tmp_path: Path) -> None:
    """On the 128-token benchmark one replica serves the 10 req/s peak, so routing is vetoed;
    at the workload's own ~3.8k-token prompts the peak needs several replicas, and affinity
    keeps each conversation's history warm: routing is recommended, priced by the model. Without
    the capacity stage the costs fall back to the benchmark's, provisionally, saying why."""
    today = decide_on(tmp_path / "today", long_conversations(), [sweep("vllm", 40)], NVIDIA)
    fallback = candidate(today, "vllm")
    assert fallback.cost_basis == "benchmark" and fallback.replicas == 1
    assert fallback.cost_per_1m_output_usd == fallback.benchmark_cost_per_1m_output_usd
    assert fallback.cost_note and "benchmark's own figures" in fallback.cost_note
    assert "capacity" in fallback.cost_note  # the capacity stage's missing-output reason
    assert today.recommendation.confidence == "provisional"
    assert any("benchmark's own figures" in r for r in today.recommendation.confidence_reasons)
    assert today.routing.recommended is False and "nothing to route between" in today.routing.reason

    record = decide_on(
        tmp_path / "own",
        long_conversations(),
        [sweep("vllm", 40)],
        NVIDIA,
        capacity=capacity_of(model()),
    )
    own = candidate(record, "vllm")
    assert own.cost_basis == "workload" and own.replicas is not None and own.replicas > 1
    routing = record.routing
    assert routing.fleet_replicas == own.replicas
    assert routing.fleet_source and "capacity stage" in routing.fleet_source
    assert routing.recommended is True and routing.routing == "affinity"
    assert routing.replicas == 4  # the simulated count nearest the fleet (1 and 4 simulated)
    assert "fitted serving model" in routing.method
    assert routing.monthly_usd_saved is not None and routing.monthly_usd_saved > 0
    assert routing.prefill_gpu_hours_saved_per_month is not None
    assert routing.monthly_usd_saved == pytest.approx(
        routing.prefill_gpu_hours_saved_per_month * GPU_HOUR_USD, rel=1e-3
    )
    # Prefill only: never more than the whole fleet's bill.
    assert routing.monthly_usd_saved < own.monthly_cost_usd


def test_the_record_round_trips_and_reads_version_1_records(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path, steady(8), [sweep("vllm", 40)], NVIDIA, capacity=capacity_of(model())
    )
    assert record.schema_version == 3
    again = DecisionRecord.from_json(json.loads(json.dumps(record.to_json())), "here")
    assert again == record
    written = tmp_path / "data" / "w" / "decision"
    assert json.loads((written / "decision.schema.json").read_text()) == record_schema()
    schema_candidate = record_schema()["$defs"]["Candidate"]["properties"]
    assert {"workload_capacity_rps", "benchmark_cost_per_1m_output_usd", "replicas"} <= set(
        schema_candidate
    )
    # A version-1 record (before the workload's costs) still serves as --previous: read as is,
    # its digest is its file's, its triggers are evaluated against this run.
    old = record.to_json()
    old["schema_version"] = 1
    v2_only = set(schema_candidate) - {
        "engine",
        "name",
        "status",
        "reasons",
        "benchmarked",
        "benchmark",
        "capacity_rps",
        "gpus_at_peak",
        "monthly_cost_mean_rate_usd",
        "cost_per_1m_output_usd",
        "monthly_cost_usd",
        "monthly_change_cost_usd",
        "monthly_total_usd",
        "switch_cost_usd",
        "payback_months",
        "flip_condition",
    }
    for c in old["candidates"]:
        for key in v2_only:
            c.pop(key, None)
        c["payback_months"] = None  # version 3 writes ``payback`` instead
    for key in ("ranking", "flips"):
        old.pop(key)
    for key in (
        "fleet_replicas",
        "fleet_source",
        "prefill_gpu_hours_saved_per_month",
        "ttft_p95_ms_saved",
        "layer_choice",  # and the fields version 3 added
    ):
        old["routing"].pop(key)
    for key in ("monthly_usd_cost", "ttft_p95_ms_cost", "method", "action", "replicas"):
        old["isolation"].pop(key)
    old["isolation"].pop("fleet_replicas")
    old["recommendation"].pop("isolation")
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    previous = read_previous(path)
    assert previous.schema_version == 1 and previous.to_json() == old
    canonical = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert record_digest(previous) == hashlib.sha256(canonical).hexdigest()
    later = decide_on(tmp_path / "later", steady(8), [sweep("vllm", 40)], NVIDIA, previous=path)
    assert later.previous is not None and later.previous.triggers
    assert all(t.status != "unknown" or t.value.value is None for t in later.previous.triggers)
    # Anything else is refused, naming what it reads.
    old["schema_version"] = 4
    path.write_text(json.dumps(old))
    with pytest.raises(Exception, match="schema_version 4 is not one of 1, 2, 3"):
        read_previous(path)


def test_explain_prints_the_workloads_figures_beside_the_benchmarks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = decide_on(
        tmp_path, steady(250), [sweep("vllm", 40)], NVIDIA, capacity=capacity_of(model())
    )
    c = candidate(record, "vllm")
    path = tmp_path / "data" / "w" / "decision" / "decision.json"
    assert enginefit(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == rationale_text(record).splitlines()[:3]
    words = " ".join(out.split())
    line = words.split("- vLLM [recommended]")[1].split(" - ")[0]
    assert f"${c.cost_per_1m_output_usd:.4f} per 1M output tokens of this workload" in line
    assert f"(benchmark's ${c.benchmark_cost_per_1m_output_usd:.4f})" in line
    assert f"{c.replicas} replicas at peak" in line
    assert "capacity on this workload: " in words
    assert f"the benchmark measured {c.capacity_rps:.2f} req/s" in words
    assert "per 1M tokens of this workload: output $" in words
    # The band: what it is made of, and the fleet, bill and price at its ends.
    assert "the band: the fit's residuals (steps ± " in words
    assert "combined with the validation error of a transferred capacity (± 30%" in words
    fewest, most = c.replicas_band
    low, high = c.monthly_cost_band_usd
    assert f"over the band: {fewest}–{most} replicas at peak, ${low:,.0f}–${high:,.0f}/month" in (
        words
    )
    assert "Measured at" in words and "your prompts are" in words
    # What binds this workload's capacity, named in the explanation's transfer sentence.
    assert ", bound by " in words
    assert "e+0" not in out  # plain notation


def test_the_document_shows_the_fitted_model_its_errors_and_both_costs(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path, steady(250), [sweep("vllm", 40)], NVIDIA, capacity=capacity_of(model())
    )
    result = capacity_stage.read_result(configuration(tmp_path).layout())
    section = workload_cost(
        cast(ReportContent, SimpleNamespace(record=record, workload_capacity=result))
    )
    (row,) = section.rows
    c = candidate(record, "vllm")
    assert row.basis == "workload" and row.transfer.startswith("Measured at")
    assert ", bound by " in row.transfer  # what binds the capacity, in the document too
    assert row.model.startswith("step = ") and "load points of vllm" in row.model
    assert len(row.errors) == len(model().point_errors) and " vs " in row.errors[0].ttft_p95
    facts = {f.label: f for f in row.facts}
    assert facts["$ per 1M output tokens (all-in)"].workload == f"${c.cost_per_1m_output_usd:.4f}"
    assert facts["$ per 1M output tokens (all-in)"].benchmark == (
        f"${c.benchmark_cost_per_1m_output_usd:.4f}"
    )
    assert facts["Replicas at the workload's peak"].workload == str(c.replicas)
    assert "e+0" not in section.model_dump_json()


def test_a_model_that_does_not_reproduce_its_benchmark_gives_no_cost_winner_or_payback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The self-check failed: the workload's capacity is unknown with that reason, and the
    decision neither prices, ranks nor pays back on it; it says to benchmark on this traffic."""
    failed = model().model_copy(
        update={
            "self_check": model().self_check.model_copy(
                update={
                    "passed": False,
                    "reason": "the serving model does not reproduce its own benchmark: p99 ITL "
                    "at x (40 req/s): predicted 20.0 ms against 40.0 ms measured (-50%), beyond "
                    "±25%",
                }
            )
        }
    )
    record = decide_on(
        tmp_path,
        steady(8),
        [sweep("vllm", 40)],
        {**NVIDIA, "current_engine": "sglang"},
        capacity=capacity_of(failed),
    )
    c = candidate(record, "vllm")
    assert c.cost_per_1m_output_usd is None and c.replicas is None
    assert c.workload_capacity_rps is None and c.cost_basis is None
    # No band either: an unknown capacity carries nothing into replicas, cost or payback.
    assert c.workload_capacity_band_rps is None and c.replicas_band is None
    assert c.monthly_cost_band_usd is None and c.cost_per_1m_output_band_usd is None
    assert c.payback is None or c.payback.months_band is None
    assert record.ranking is None or record.ranking.basis is None
    assert c.payback is None or c.payback.status == "unknown"
    assert "does not reproduce its own benchmark" in record.recommendation.headline
    text = rationale_text(record)
    assert "no benchmark on this traffic (" in text
    assert "run an open-loop benchmark of vLLM" in text
    assert "benchmark this deployment on your own traffic (enginefit loadtest)" in text
