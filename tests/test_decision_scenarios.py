"""Whole decisions, one per branch of the decision tree
(docs/decision-rules.md): generated traffic and
benchmark result files (vLLM ``bench serve`` JSON with sidecar manifests) go through the real
stages as the configured commands run them; the decision reads what they wrote.

Costs are worked by hand from the fixtures (tests/decision_fixtures.py): a sweep bracketed at
capacity c req/s with 200 output tokens on one $3/h GPU costs 3 ÷ (c × 200 × 3600) × 10⁶ per 1M
output tokens; the fleet at the peak rate r is ⌈r ÷ c⌉ replicas × $3 × 730 h a month.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest

from pipeline.decision.stage import read_previous
from tests.decision_fixtures import (
    LLAMA_8B_ON_H100,
    candidate,
    rule,
    statuses,
    steady_traffic,
    sweep,
    traffic,
)
from tests.decision_fixtures import decide_on as decide_drawing_figures

# What these tests read is the decision, not the stages' figures, which took most of each
# scenario's time to draw.
decide_on = partial(decide_drawing_figures, figures=False)

NVIDIA_DATACENTER = {"deployment": "datacenter", "hardware": ["nvidia"]}


def one_stable_model(changes_per_quarter: float) -> dict[str, object]:
    """A fixed NVIDIA fleet serving one model, engineers at $30,000 a week."""
    return {
        **NVIDIA_DATACENTER,
        "fixed_sku": True,
        "models": ["m"],
        "model_changes_per_quarter": changes_per_quarter,
        "engineer_week_usd": 30_000,
    }


def conversations() -> object:
    """Multi-turn chat: 41 conversations of 10 turns over a 64-block (1,024-token) system prompt,
    10 req/s × 2 s: every prompt starts with the same 1,024 tokens. (41, not 40: round-robin
    over 4 replicas then sends a conversation's turns to different replicas.)"""
    return traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64)


def test_laptop_single_user_on_apple_gets_llama_cpp(tmp_path: Path) -> None:
    frame = traffic(60, rate_rps=0.2, e2e_s=2.0)  # one request at a time
    record = decide_on(tmp_path, frame, [], {"deployment": "local", "hardware": ["apple"]})
    rec = record.recommendation
    assert (rec.engine, rec.runner_up, rec.confidence) == ("llama.cpp", "ollama", "provisional")
    assert statuses(record)["tensorrt-llm"] == "excluded"  # NVIDIA only
    assert candidate(record, "tensorrt-llm").reasons[0].startswith("hardware: runs on nvidia")
    assert rule(record, "local").fired is True
    assert rule(record, "concurrency").fired is True  # peak 1 ≤ 2
    assert any("no benchmark on this traffic" in r for r in rec.confidence_reasons)


def test_stable_model_on_a_fixed_nvidia_fleet_at_huge_volume_gets_tensorrt_llm(
    tmp_path: Path,
) -> None:
    """vLLM at 5 req/s needs 4 replicas for the 20 req/s peak ($8,760/month), TensorRT-LLM at
    7 req/s needs 3 ($6,570). Half a model change a quarter at $12,000 an engineer-week ($300
    an hour), each a restart: TensorRT-LLM 0.5/3 × 4 h × $300 = $200/month, vLLM 0.5/3 × 2 h ×
    $300 = $100: totals $6,770 vs $8,860, 24 % apart. A new deployment: TensorRT-LLM's extra
    engineer-week ($12,000) is paid back by the $2,090 a month it saves in 5.7 months."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 7, backend="pytorch")],
        {**one_stable_model(changes_per_quarter=0.5), "engineer_week_usd": 12_000},
    )
    rec = record.recommendation
    # No capacity stage output: the benchmark's own costs decide, provisionally, and say so.
    assert (rec.engine, rec.runner_up, rec.confidence) == ("tensorrt-llm", "vllm", "provisional")
    assert any("costs are the benchmark's own figures" in r for r in rec.confidence_reasons)
    assert rule(record, "model_churn").fired is True
    trt, vllm = candidate(record, "tensorrt-llm"), candidate(record, "vllm")
    assert trt.monthly_total_usd == pytest.approx(6_570 + 200)
    assert vllm.monthly_total_usd == pytest.approx(8_760 + 100)
    assert trt.cost_per_1m_output_usd == pytest.approx(3 / (7 * 200 * 3600) * 1e6, rel=1e-5)
    assert trt.payback is not None and trt.payback.months == pytest.approx(12_000 / 2_090)


def test_tensorrt_llm_is_not_chosen_when_models_change_weekly(tmp_path: Path) -> None:
    """Thirteen changes a quarter at $300 an hour: compared before rounding to whole replicas,
    TensorRT-LLM 20/7 × $2,190 = $6,257.14 + n/3 × 4 h × $300, vLLM $8,760 + n/3 × 2 h × $300.
    TensorRT-LLM ranks first past the 10 % band when 8,760 + 200 n ≥ 1.1 × (6,257.14 + 400 n),
    n ≤ 7.82; as a new deployment it must also pay back its extra engineer-week ($12,000) within
    12 months on the whole-replica bills, (8,760 + 200 n) − (6,570 + 400 n) ≥ 1,000: n ≤ 5.95."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 7, backend="pytorch")],
        {**one_stable_model(changes_per_quarter=13), "engineer_week_usd": 12_000},
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == ("vllm", "tensorrt-llm")
    flip = candidate(record, "tensorrt-llm").flip_condition
    assert flip is not None
    assert (
        "TensorRT-LLM becomes the answer if the number of model changes a quarter falls to 5.95 "
        "(today 13)." in flip
    )
    trigger = next(t for t in record.triggers if t.id == "flip.model_changes.down")
    assert (trigger.metric, trigger.comparator, trigger.value.value) == (
        "requirements.model_changes_per_quarter",
        "<=",
        13,
    )
    assert trigger.threshold == pytest.approx((2_190 - 1_000) / 200, rel=1e-3)


def test_prefix_heavy_traffic_with_one_engine_benchmarked(tmp_path: Path) -> None:
    """Every prompt shares its first 1,024 tokens: SGLang or vLLM plus cache-aware routing; only
    vLLM was benchmarked, so "benchmark SGLang on your traffic" and the answer is provisional.
    Four round-robin replicas meet each conversation on a cold replica three times out of four;
    affinity keeps it warm, far past the 10 % routing threshold."""
    frame = conversations()
    record = decide_on(
        tmp_path, frame, [sweep("vllm", 4, input_tokens_mean=1_728)], NVIDIA_DATACENTER
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up, rec.confidence) == ("vllm", "sglang", "provisional")
    # Recommending vLLM while asking for a SGLang benchmark, said without contradiction.
    assert (
        "vLLM is the cheapest engine with a cost here, but the decision tree favours SGLang for "
        "this traffic, which has no benchmark on it: benchmark SGLang on your traffic before "
        "committing to vLLM"
    ) in rec.confidence_reasons
    assert rule(record, "prefix").fired is True
    routing = record.routing
    assert routing.recommended is True and routing.routing == "affinity"
    # The platform is not set: the layers that serve vLLM are listed, none chosen
    # (tests/test_decision_rules_expert.py chooses by platform).
    assert rec.routing_layer is routing.layer is None
    # KServe routes by prefix through llm-d's scheduler (the catalog's KSERVE-LLMISVC source).
    assert routing.alternatives == [
        "dynamo",
        "llm-d",
        "vllm-production-stack",
        "kserve",
        "ray-serve",
    ]
    assert routing.prompt_tokens_saved_share is not None
    assert routing.prompt_tokens_saved_share > 0.1


def test_little_sharing_on_mixed_hardware_gets_vllm(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path, steady_traffic(), [], {"deployment": "datacenter", "hardware": ["nvidia", "amd"]}
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up, rec.confidence) == ("vllm", "sglang", "provisional")
    assert candidate(record, "tensorrt-llm").status == "excluded"  # one engine across the fleet
    assert rule(record, "prefix").fired is False


def test_tgi_today_is_kept_running_while_migrating(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "current_engine": "tgi", "engineer_week_usd": 6_000},
    )
    assert record.recommendation.engine == "vllm"
    tgi = candidate(record, "tgi")
    assert tgi.status == "excluded"
    assert any("keep it running and plan the migration" in r for r in tgi.reasons)
    payback = rule(record, "payback")
    assert "migrate to vLLM ($12,000 of migration work)" in payback.effect  # 2 weeks × $6,000
    assert candidate(record, "vllm").switch_cost_usd == 12_000


def test_no_benchmark_at_all_is_provisional(tmp_path: Path) -> None:
    record = decide_on(tmp_path, steady_traffic(), [], NVIDIA_DATACENTER)
    assert record.recommendation.confidence == "provisional"
    assert rule(record, "cost").fired is None
    assert rule(record, "cost").effect.startswith("unknown: no bench results configured")


def test_two_engines_within_the_margin_are_a_tie_decided_on_migration_cost(
    tmp_path: Path,
) -> None:
    """SGLang at 5.2 req/s is 4 % cheaper per token than vLLM at 5 — inside the 10 % margin;
    both need 4 replicas (same monthly GPU cost): a tie, decided on migration weeks (2 each)
    then the decision tree's order (little sharing: vLLM first)."""
    record = decide_on(
        tmp_path, steady_traffic(), [sweep("vllm", 5), sweep("sglang", 5.2)], NVIDIA_DATACENTER
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up, rec.confidence) == ("vllm", "sglang", "tie")
    assert rule(record, "margin").fired is True


def test_an_incumbent_whose_replacement_does_not_pay_back_within_a_year_stays(
    tmp_path: Path,
) -> None:
    """SGLang runs today at 5 req/s (4 replicas, $8,760/month); vLLM at 7 needs 3 ($6,570):
    saves $2,190 a month. Migrating costs 8 weeks × $6,000 = $48,000, and vLLM's fleet runs
    beside SGLang's for those 8 weeks plus 2 of revalidation: $6,570 × 10 ÷ (730 ÷ 168) weeks
    a month = $15,119.78. (48,000 + 15,119.78) ÷ 2,190 = 28.8 months > 12."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("sglang", 5), sweep("vllm", 7)],
        {
            **NVIDIA_DATACENTER,
            "current_engine": "sglang",
            "engineer_week_usd": 6_000,
            "migration_engineer_weeks": {"vllm": 8},
        },
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == ("sglang", "vllm")
    payback = candidate(record, "vllm").payback
    assert payback is not None and payback.status == "months"
    assert payback.parallel_run_usd == pytest.approx(6_570 * 10 / (730 / 168), rel=1e-5)
    assert payback.months == pytest.approx((48_000 + 6_570 * 10 / (730 / 168)) / 2_190, rel=1e-5)
    assert rule(record, "payback").fired is True


def test_untrusted_tenants_sharing_prefixes_are_isolated_at_a_measured_cost(
    tmp_path: Path,
) -> None:
    """Four tenants share one system prompt, so cache hits cross tenants; replayed with and
    without per-tenant isolation, isolation loses the hits on the other tenants' copies."""
    frame = traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64, tenants=4)
    record = decide_on(
        tmp_path,
        frame,
        [],
        {**NVIDIA_DATACENTER, "untrusted_tenants": True},
        compare_isolation=True,
    )
    isolation = record.isolation
    assert isolation.recommended is True
    assert isolation.cross_tenant_share_of_hits is not None
    assert isolation.cross_tenant_share_of_hits > 0
    assert isolation.hit_ratio_shared is not None and isolation.hit_ratio_isolated is not None
    assert isolation.hit_ratio_isolated < isolation.hit_ratio_shared
    assert rule(record, "isolation").fired is True
    assert "shared vs" in isolation.reason


def test_isolation_cost_is_unknown_until_both_replays_exist(tmp_path: Path) -> None:
    frame = traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64, tenants=4)
    record = decide_on(tmp_path, frame, [], {**NVIDIA_DATACENTER, "untrusted_tenants": True})
    assert record.isolation.recommended is True
    assert record.isolation.hit_ratio_isolated is None
    assert "set simulation.compare_isolation: true" in record.isolation.reason


def test_a_required_feature_the_engine_lacks_excludes_it(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    from pipeline.decision.catalog import _bundled_text

    text = _bundled_text().replace(
        'lora: {support: full, note: "multi-LoRA; /load_lora_adapter (not yet on the TPU '
        'backend, SGLang-JAX)", evidence_date: 2026-10-30}',
        'lora: {support: unsupported, note: "not in this fork", evidence_date: 2026-10-30}',
    )
    catalog.write_text(text)
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [],
        {**NVIDIA_DATACENTER, "features": ["lora"]},
        decision={"catalog": str(catalog)},
    )
    sglang = candidate(record, "sglang")
    assert sglang.status == "excluded"
    assert "features: lacks lora" in sglang.reasons
    assert record.catalog["source"] == str(catalog)


def test_triggers_across_two_quarters_fire_when_concurrency_collapses(tmp_path: Path) -> None:
    """Quarter 1: peak concurrency 20 (vLLM/SGLang territory). Quarter 2: one request at a time:
    the "concurrency.low.enters" trigger (peak ≤ 2) fires and the decision is revisited."""
    first = decide_on(tmp_path / "q1", steady_traffic(), [sweep("vllm", 5)], NVIDIA_DATACENTER)
    low = next(t for t in first.triggers if t.id == "concurrency.low.enters")
    assert (low.comparator, low.threshold, low.value.value, low.status) == (
        "<=",
        2,
        20,
        "not_fired",
    )
    record_path = tmp_path / "q1" / "data" / "w" / "decision" / "decision.json"
    assert read_previous(record_path) == first
    second = decide_on(
        tmp_path / "q2",
        traffic(60, rate_rps=0.2, e2e_s=2.0),
        [sweep("vllm", 5)],
        NVIDIA_DATACENTER,
        previous=record_path,
    )
    previous = second.previous
    assert previous is not None and previous.engine == "vllm"
    check = next(c for c in previous.triggers if c.id == "concurrency.low.enters")
    assert (check.previous_value.value, check.value.value, check.status) == (20, 1, "fired")
    assert "concurrency.low.enters" in previous.fired
    assert second.recommendation.state == "revisit"
    unchanged = next(c for c in previous.triggers if c.id.startswith("prefix.heavy"))
    assert unchanged.status == "not_fired"
    assert math.isfinite(second.measured("shape.concurrency.peak"))


def test_cache_size_from_the_hardware_reads_the_curves_at_that_capacity(tmp_path: Path) -> None:
    """requirements.kv_cache sizes the cache (Llama-3.1-8B on an H100: 449,x tokens), which the
    simulation grid did not replay: the routing value is read from the one-pass curves there.
    Both capacities hold this small working set whole, so the saving equals the replay's."""
    kv = dict(LLAMA_8B_ON_H100)
    frame = conversations()
    sized = decide_on(tmp_path / "sized", frame, [], {**NVIDIA_DATACENTER, "kv_cache": kv})
    replayed = decide_on(tmp_path / "replayed", frame, [], NVIDIA_DATACENTER)
    routing = sized.routing
    assert routing.cache_tokens_per_replica is not None
    assert 449_000 <= routing.cache_tokens_per_replica < 450_000
    assert routing.cache_tokens_source.startswith("requirements.kv_cache: 449,")
    assert routing.method.startswith("one-pass capacity curves")
    assert replayed.routing.method.startswith("simulated replay")
    assert routing.prompt_tokens_saved_share == replayed.routing.prompt_tokens_saved_share


def test_a_benchmark_on_other_hardware_does_not_override_the_tree(tmp_path: Path) -> None:
    """A laptop team with only an H100 benchmark of vLLM: that cost is not theirs, so it is
    named and not ranked, and the tree's llama.cpp stands."""
    frame = traffic(60, rate_rps=0.2, e2e_s=2.0)
    record = decide_on(
        tmp_path, frame, [sweep("vllm", 5)], {"deployment": "local", "hardware": ["apple"]}
    )
    assert record.recommendation.engine == "llama.cpp"
    assert any(
        "vLLM's benchmark is not about your deployment (run on H100 (nvidia); your hardware is "
        "apple)" in r
        for r in record.recommendation.confidence_reasons
    )


def test_the_engine_running_today_stays_while_a_switch_cannot_be_costed(tmp_path: Path) -> None:
    """SGLang runs today and has no benchmark; vLLM's benchmark alone cannot show a switch
    paying back, so SGLang stays and vLLM's flip says what would change that."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "current_engine": "sglang", "engineer_week_usd": 6_000},
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == ("sglang", "vllm")
    assert rule(record, "payback").fired is None
    assert candidate(record, "vllm").flip_condition == (
        "vLLM wins once switching is shown to pay back within 12 months (supply a monthly cost "
        "of SGLang at your peak (SGLang has no benchmark on this traffic)). vLLM becomes the "
        "answer if the hardware becomes nvidia, neuron (today nvidia)."
    )


def test_when_no_engine_the_tree_points_to_meets_the_slo_none_is_recommended(
    tmp_path: Path,
) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5, never_met=True), sweep("sglang", 5, never_met=True)],
        NVIDIA_DATACENTER,
    )
    rec = record.recommendation
    assert rec.engine is None and rec.confidence == "provisional"
    assert rec.headline.startswith(
        "No engine recommended: no engine the decision tree points to meets the requirements ("
    )
    assert "vLLM: slo: never met the SLO in its benchmark" in rec.headline


def test_a_tie_names_what_decided_it(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("sglang", 5.2)],
        {**NVIDIA_DATACENTER, "migration_engineer_weeks": {"vllm": 3}},
    )
    rec = record.recommendation
    assert (rec.engine, rec.confidence) == ("sglang", "tie")
    assert rec.confidence_reasons[0].endswith(
        "SGLang is chosen because its migration is shorter (2 vs 3 engineer-weeks)"
    )
    margin = next(t for t in record.triggers if t.id.startswith("cost.margin_top_two"))
    # A tie today: the trigger waits for the gap to open past the margin.
    assert (margin.id, margin.comparator, margin.status) == (
        "cost.margin_top_two.leaves",
        ">=",
        "not_fired",
    )
