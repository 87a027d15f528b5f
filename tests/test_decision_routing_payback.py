"""Two decisions an expert makes that the rules used to drop: a routing layer whose replay
saving clears the threshold is recommended even when the fleet size is unknown (its value then
given as a range over the simulated replica counts), and a payback figure whenever both
engines have a monthly cost, measured or transferred: for a team switching from the engine it
runs, and for a team choosing between two for a new deployment (the extra adoption work
against the monthly saving).

Every decision runs the real stages on generated traffic and benchmark files
(tests/decision_fixtures.py). The expected figures are worked here from the stage outputs the
decision read (the simulator's hit counts) or by hand from the fixtures: a sweep bracketed at
c req/s on one $3/h GPU serves the 20 req/s peak with ⌈20 ÷ c⌉ replicas at $2,190 a month each;
at $12,000 an engineer-week an hour costs $300.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import polars as pl
import pytest

from pipeline.bench.cost import HOURS_PER_MONTH
from pipeline.capacity import stage as capacity_stage
from pipeline.decision.evidence import SECONDS_PER_MONTH
from pipeline.decision.present import rationale_text
from pipeline.layout import WorkloadLayout
from pipeline.sim import stage as sim_stage
from pipeline.unknown import Unknown
from tests.decision_fixtures import (
    candidate,
    capacity_of,
    rule,
    steady_traffic,
    sweep,
    traffic,
)
from tests.decision_fixtures import decide_on as decide_drawing_figures
from tests.test_decision_rules_expert import fitted_model

# What these tests read is the decision, not the stages' figures, which took most of each
# scenario's time to draw.
decide_on = partial(decide_drawing_figures, figures=False)

WEEKS_PER_MONTH = HOURS_PER_MONTH / (24 * 7)


def agent_sessions() -> pl.DataFrame:
    """An agent workload: 41 sessions of 10 steps over a shared 1,024-token tool preamble,
    each step resending the session's history (10 req/s, 2 s each)."""
    return traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64)


def test_routing_is_recommended_with_its_range_when_the_fleet_size_is_unknown(
    tmp_path: Path,
) -> None:
    """No benchmark yet, so no fleet size. The replay at 2 and 4 replicas shows cache-aware
    routing saving a large share of prompt tokens over round-robin: the routing layer is
    recommended, its saving given over the simulated counts (not dropped), the headline says
    so, and the fewest replicas where it clears 10 % are named. The team runs Ray: the tree
    leads to SGLang for this prefix-heavy traffic, and Ray Serve LLM, the one layer on Ray, is
    offered with its caveat (its SGLang support is in early development)."""
    record = decide_on(
        tmp_path,
        agent_sessions(),
        [],
        {
            "deployment": "datacenter",
            "hardware": ["nvidia"],
            "platform": {"orchestrator": "ray", "gateway": "none"},
        },
        replicas=(1, 2, 4),
        routings=("round-robin", "cache-aware"),
    )
    routing = record.routing
    # The saving at each simulated count, from the simulator's own hit counts.
    summaries = sim_stage.read_summaries(WorkloadLayout(tmp_path / "data" / "w"))
    hits = {
        (s.replicas, s.routing): s.hit_tokens
        for s in summaries
        if not s.tenant_isolation and s.replicas > 1
    }
    prompt = next(s.prompt_tokens for s in summaries)
    saving = {
        r: (hits[(r, "cache-aware")] - hits[(r, "round-robin")]) / prompt  # type: ignore[operator]
        for r in (2, 4)
    }
    assert saving[4] >= 0.10  # clears the threshold at the largest simulated fleet
    assert routing.recommended is True and routing.fleet_replicas is None
    assert (routing.routing, routing.replicas) == ("cache-aware", 4)
    assert routing.prompt_tokens_saved_share == pytest.approx(saving[4], rel=1e-5)
    low, high = routing.prompt_tokens_saved_share_range  # type: ignore[misc]
    assert (low, high) == pytest.approx((min(saving.values()), max(saving.values())), rel=1e-5)
    assert routing.worth_from_replicas == min(r for r, s in saving.items() if s >= 0.10)
    rate = record.measured("shape.arrivals.mean_rate_rps")
    prompt_mean = prompt / 410
    tokens_low, tokens_high = routing.monthly_prompt_tokens_saved_range  # type: ignore[misc]
    assert tokens_low == pytest.approx(low * rate * prompt_mean * SECONDS_PER_MONTH, rel=1e-4)
    assert tokens_high == pytest.approx(high * rate * prompt_mean * SECONDS_PER_MONTH, rel=1e-4)
    assert routing.monthly_usd_saved_range is None  # no price without a benchmark: not 0
    effect = rule(record, "routing")
    assert effect.fired is True
    assert "the fleet size is unknown (unknown: the recommended engine has no benchmark)" in (
        effect.effect
    )
    assert f"over the simulated 2, 4 replicas it saves {low:.1%}–{high:.1%} of prompt" in (
        effect.effect
    )
    assert record.recommendation.engine == "sglang"
    assert (routing.layer, record.recommendation.routing_layer) == ("ray-serve", "ray-serve")
    assert routing.layer_choice == (
        "Ray Serve LLM runs on a Ray cluster, also serves vLLM, so a switch keeps the router, "
        "though for SGLang: community SGLang support is in early development"
    )
    assert "with prefix-aware routing (Ray Serve LLM)" in record.recommendation.headline


def stable_high_volume_team(**more: object) -> dict[str, object]:
    """One model on a fixed NVIDIA fleet, changed once a quarter; steady traffic is 10.5
    billion output tokens a month (huge volume); $12,000 an engineer-week."""
    return {
        "deployment": "datacenter",
        "hardware": ["nvidia"],
        "fixed_sku": True,
        "models": ["m"],
        "model_changes_per_quarter": 1,
        "engineer_week_usd": 12_000,
        **more,
    }


def test_a_new_deployment_choosing_between_vllm_and_tensorrt_llm_gets_a_payback(
    tmp_path: Path,
) -> None:
    """The textbook TensorRT-LLM team, nothing running yet. vLLM at 5 req/s: 4 replicas,
    $8,760 + one change a quarter (2 h × $300 ÷ 3 = $200) = $8,960 a month; TensorRT-LLM at 10:
    2 replicas, $4,380 + 4 h × $300 ÷ 3 = $400: $4,780. It takes a week more to adopt (3
    engineer-weeks against 2: $12,000), paid back by $4,180 a month in 12,000 ÷ 4,180 = 2.87
    months: TensorRT-LLM, with the figure."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 10, backend="pytorch")],
        stable_high_volume_team(),
    )
    assert rule(record, "model_churn").fired is True  # the TensorRT-LLM branch
    assert record.recommendation.engine == "tensorrt-llm"
    trt, vllm = candidate(record, "tensorrt-llm"), candidate(record, "vllm")
    assert (trt.monthly_total_usd, vllm.monthly_total_usd) == pytest.approx((4_780, 8_960))
    found = trt.payback
    assert found is not None and (found.status, found.kind, found.against) == (
        "months",
        "choice",
        "vllm",
    )
    assert found.months == pytest.approx(12_000 / 4_180, rel=1e-5)
    assert found.reason == (
        "($12,000 more adoption work than vLLM) ÷ $4,180 saved a month = 2.9 months"
    )
    assert record.measured("decision.payback_months[tensorrt-llm]") == pytest.approx(
        12_000 / 4_180, rel=1e-5
    )
    payback_rule = rule(record, "payback")
    assert payback_rule.fired is False and payback_rule.effect == (
        "TensorRT-LLM saves $4,180 a month over vLLM for $12,000 more adoption work: pays back "
        "in 2.9 months (≤ 12)"
    )
    # vLLM, the runner-up, costs more to run: choosing it never pays back.
    assert vllm.payback is not None and (vllm.payback.status, vllm.payback.against) == (
        "never",
        "tensorrt-llm",
    )
    text = " ".join(rationale_text(record).split())
    assert "payback of choosing it over vLLM: 2.9 months" in text


def test_a_new_deployments_extra_adoption_work_that_does_not_pay_back_keeps_the_other(
    tmp_path: Path,
) -> None:
    """TensorRT-LLM at 5.6 req/s needs 4 replicas like vLLM at 5 ($8,760 each): 12 % cheaper
    before rounding (ranked first) but the same bill, so its extra $12,000 of adoption work
    never pays back: vLLM, and what TensorRT-LLM would need to save."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 5.6, backend="pytorch")],
        stable_high_volume_team(model_changes_per_quarter=0),
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == ("vllm", "tensorrt-llm")
    trt = candidate(record, "tensorrt-llm")
    assert trt.payback is not None and trt.payback.status == "never"
    assert (
        "TensorRT-LLM saves nothing a month over vLLM ($0) and takes $12,000 more adoption "
        "work: vLLM is recommended" in rec.confidence_reasons
    )
    assert rule(record, "payback").fired is True
    flip = next(t for t in record.triggers if t.id == "flip[tensorrt-llm]")
    assert (flip.metric, flip.comparator, flip.threshold) == (
        "decision.payback_months[tensorrt-llm]",
        "<=",
        12,
    )


def test_a_switch_is_paid_back_on_a_transferred_cost_against_a_measured_one(
    tmp_path: Path,
) -> None:
    """The team runs vLLM today at 120 req/s (2,400 requests over 20 s). The capacity stage
    carries vLLM's fitted serving model to this workload (its cost transferred: the replicas
    the capacity stage sized, $2,190 each, + one change a quarter, 2 h × $300 ÷ 3 = $200);
    TensorRT-LLM has only its benchmark's own figures (measured: bracketed at 120 req/s, one
    replica, $2,190 + 4 h × $300 ÷ 3 = $400). Both have a monthly cost, so the switch's payback
    is worked: 3 engineer-weeks ($36,000) plus TensorRT-LLM's fleet for the 3 + 2 weeks both
    run ($2,190 × 5 ÷ (730 ÷ 168) = $2,520), over the saving: within 12 months, TensorRT-LLM."""
    record = decide_on(
        tmp_path,
        traffic(2_400, rate_rps=120, e2e_s=1.0),
        [sweep("vllm", 40), sweep("tensorrt-llm", 120, backend="pytorch")],
        stable_high_volume_team(current_engine="vllm"),
        capacity=capacity_of(fitted_model()),
    )
    carried = capacity_stage.read_result(WorkloadLayout(tmp_path / "data" / "w")).candidates
    assert len(carried) == 1 and carried[0].deployment.engine == "vllm"
    vllm_cost = carried[0].cost
    assert not isinstance(vllm_cost, Unknown) and vllm_cost.replicas > 1
    vllm, trt = candidate(record, "vllm"), candidate(record, "tensorrt-llm")
    assert (vllm.cost_basis, trt.cost_basis) == ("workload", "benchmark")
    assert vllm.monthly_total_usd == pytest.approx(vllm_cost.replicas * 2_190 + 200)
    assert trt.monthly_total_usd == pytest.approx(2_190 + 400)
    saving = vllm_cost.replicas * 2_190 + 200 - 2_590
    parallel = 2_190 * 5 / WEEKS_PER_MONTH
    assert parallel == pytest.approx(2_520)
    found = trt.payback
    assert found is not None and (found.status, found.kind, found.against) == (
        "months",
        "switch",
        "vllm",
    )
    assert found.parallel_run_usd == pytest.approx(parallel)
    assert found.months == pytest.approx((36_000 + parallel) / saving, rel=1e-6)
    assert found.months <= 12
    assert record.recommendation.engine == "tensorrt-llm"


def test_a_payback_without_a_monthly_cost_names_which(tmp_path: Path) -> None:
    """vLLM runs today but has no benchmark: the switch to TensorRT-LLM cannot be costed, and
    the payback says it is vLLM's monthly cost that is missing, and why."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("tensorrt-llm", 10, backend="pytorch")],
        stable_high_volume_team(current_engine="vllm"),
    )
    found = candidate(record, "tensorrt-llm").payback
    assert found is not None and found.status == "unknown"
    assert found.reason == (
        "the switch cannot be costed: supply a monthly cost of vLLM at your peak (vLLM has no "
        "benchmark on this traffic)"
    )
