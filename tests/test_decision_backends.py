"""Decisions resting on corrected catalog facts: TensorRT-LLM's change cost follows
the serving backend its benchmark manifest names (PyTorch: a restart; TensorRT: an engine build
per change; not named: unknown, and said), llama.cpp's default slots share one KV pool, and the
catalog-age trigger reads the oldest fact the decision used.

Costs are worked by hand from the fixtures (tests/decision_fixtures.py): the steady traffic
peaks at 20 req/s; a sweep bracketed at c req/s on one $3/h GPU needs ⌈20 ÷ c⌉ replicas at
$3 × 730 h = $2,190 each a month. Weekly model changes are 13 a quarter, 13/3 a month; at
$12,000 an engineer-week an hour costs $300.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.decision.catalog import _bundled_text
from pipeline.errors import ConfigError
from tests.decision_fixtures import candidate, decide_on, rule, steady_traffic, sweep, traffic

WEEKLY = 13.0
FIXED_NVIDIA_FLEET = {
    "deployment": "datacenter",
    "hardware": ["nvidia"],
    "fixed_sku": True,
    "models": ["m"],
    "model_changes_per_quarter": WEEKLY,
    "engineer_week_usd": 12_000,
}


def _weekly_changes(tmp_path: Path, backend: str | None) -> object:
    """vLLM at 5 req/s (4 replicas, $8,760) against TensorRT-LLM at 10 (2 replicas, $4,380)."""
    return decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 10, backend=backend)],
        FIXED_NVIDIA_FLEET,
    )


def test_tensorrt_llm_on_its_pytorch_backend_is_not_ruled_out_by_weekly_model_changes(
    tmp_path: Path,
) -> None:
    """PyTorch backend: a change is a restart, 4 engineer-hours (no GPU build): 13/3 × 4 × $300
    = $5,200 a month; vLLM 13/3 × 2 × $300 = $2,600. Totals $4,380 + $5,200 = $9,580 against
    $8,760 + $2,600 = $11,360: TensorRT-LLM, 18.6 % cheaper."""
    record = _weekly_changes(tmp_path, "pytorch")
    churn = rule(record, "model_churn")
    assert churn.fired is True
    assert (churn.evidence["tensorrt_llm_backend"], churn.evidence["tensorrt_llm_change"]) == (
        "pytorch",
        "restart",
    )
    assert churn.effect.startswith("TensorRT-LLM first, weighed against its model-change cost")
    assert "pytorch backend" in churn.effect
    trt, vllm = candidate(record, "tensorrt-llm"), candidate(record, "vllm")
    assert trt.benchmark.startswith("tensorrt-llm 1.0 pytorch / ")  # the backend names it
    # What remains real on the PyTorch path is said, not charged.
    assert any(
        r.startswith("not charged per model change: quantisation step (30 GPU-minutes and 2 ")
        for r in trt.reasons
    )
    assert any(r.startswith("not charged per model change: new-architecture") for r in trt.reasons)
    assert trt.status != "excluded"
    assert trt.monthly_change_cost_usd == pytest.approx(5_200)
    assert trt.monthly_total_usd == pytest.approx(9_580)
    assert vllm.monthly_total_usd == pytest.approx(11_360)
    assert record.recommendation.engine == "tensorrt-llm"
    # The team's SGLang-vs-vLLM margins are shown as estimates wherever they appear.
    margins = rule(record, "prefix").evidence["reported_margins_secondary"]
    assert margins["shared-prefix"].endswith("(estimate: no primary source)")
    # Migration on the PyTorch backend: 3 engineer-weeks (the TensorRT backend's 6 does not apply).
    assert trt.switch_cost_usd == pytest.approx(3 * 12_000)


def test_tensorrt_llm_on_its_tensorrt_backend_is_charged_a_build_per_change(
    tmp_path: Path,
) -> None:
    """TensorRT backend: 8 engineer-hours and a 30-minute build on its one $3/h GPU per change:
    13/3 × (8 × $300 + $1.50) = $10,406.50 a month; total $14,786.50 against vLLM's $11,360.
    Weekly changes also take it off the TensorRT-LLM branch."""
    record = _weekly_changes(tmp_path, "tensorrt")
    churn = rule(record, "model_churn")
    assert churn.fired is False
    assert "models change 13 times a quarter (stable: ≤ 1) and its tensorrt backend" in (
        churn.effect
    )
    trt = candidate(record, "tensorrt-llm")
    assert trt.monthly_change_cost_usd == pytest.approx(13 / 3 * (8 * 300 + 1.5))
    assert trt.monthly_total_usd == pytest.approx(4_380 + 13 / 3 * 2_401.5)
    assert record.recommendation.engine == "vllm"
    assert trt.switch_cost_usd == pytest.approx(6 * 12_000)


def test_tensorrt_llm_without_a_backend_has_an_unknown_change_cost_and_says_so(
    tmp_path: Path,
) -> None:
    record = _weekly_changes(tmp_path, None)
    churn = rule(record, "model_churn")
    assert churn.fired is None
    assert "TensorRT-LLM's serving backend (backend: pytorch or tensorrt" in churn.effect
    assert churn.evidence["tensorrt_llm_backend"] == "unknown"
    trt = candidate(record, "tensorrt-llm")
    assert trt.monthly_change_cost_usd is None and trt.monthly_total_usd is None
    assert any(
        r.startswith("model-change cost unknown: its benchmark manifest does not name the serving")
        and "default is pytorch" in r
        for r in trt.reasons
    )
    rec = record.recommendation
    assert rec.confidence == "provisional"
    assert (
        "TensorRT-LLM's model-change cost is unknown: its benchmark manifest does not name its "
        "serving backend (pytorch, tensorrt), so the ranking leaves model changes out"
    ) in rec.confidence_reasons


def test_a_backend_the_catalog_does_not_know_names_the_manifest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _weekly_changes(tmp_path, "onnx")
    manifest = tmp_path / "bench-results" / "1-tensorrt-llm" / "enginefit-bench.yaml"
    assert str(caught.value).startswith(
        f"{manifest}: backend: TensorRT-LLM has no backend 'onnx' in the engine catalog "
        "(its backends are pytorch, tensorrt)"
    )


def test_llama_cpp_serves_long_context_whole_with_its_default_slots(tmp_path: Path) -> None:
    """Prompts of (2,048 shared + 8 own) blocks × 16 = 32,896 tokens (≥ 32,768: long_context
    required) on a laptop.
    llama-server's default -np auto shares one KV pool across its 4 slots, so one request can
    use the whole context: no "limited" note for llama.cpp (Ollama's context defaults stay)."""
    frame = traffic(30, rate_rps=0.2, e2e_s=2.0, system_blocks=2_048)
    record = decide_on(tmp_path, frame, [], {"deployment": "local", "hardware": ["apple"]})
    features = rule(record, "features")
    assert "long_context" in features.effect
    assert record.recommendation.engine == "llama.cpp"
    llama, ollama = candidate(record, "llama.cpp"), candidate(record, "ollama")
    assert not any(r.startswith("long_context limited") for r in llama.reasons)
    assert any(r.startswith("long_context limited: default context 4k") for r in ollama.reasons)


def test_the_catalog_age_trigger_reads_the_oldest_fact_the_decision_used(tmp_path: Path) -> None:
    """The decision is dated 2026-11-29 (the fixtures' --as-of). Of the facts it used, the
    oldest dated is TensorRT-LLM's PyTorch-backend change cost (PR of 2025-06-18): 529 days,
    past the 183-day limit. The rationale says to re-verify it and names it; the trigger is
    armed for its re-verification (a trigger fired from the start would reopen every
    decision)."""
    record = _weekly_changes(tmp_path, "pytorch")
    m = record.measurements
    assert m["catalog.oldest_fact"] == "engines.tensorrt-llm.change_by_backend.pytorch"
    assert m["catalog.oldest_fact_date"] == "2025-06-18"
    assert m["catalog.oldest_fact_age_days"] == 529
    assert record.catalog["oldest_fact_used"] == "engines.tensorrt-llm.change_by_backend.pytorch"
    stale = next(t for t in record.triggers if t.id.startswith("catalog.stale"))
    assert (stale.id, stale.metric, stale.comparator, stale.threshold, stale.value) == (
        "catalog.stale.leaves",
        "catalog.oldest_fact_age_days",
        "<=",
        183,
        529,
    )
    assert stale.status == "not_fired" and record.recommendation.state == "decided"
    assert "engines.tensorrt-llm.change_by_backend.pytorch, evidence of 2025-06-18" in stale.why
    age = rule(record, "catalog_age")
    assert age.fired is True
    assert age.effect.startswith(
        "the oldest fact used is engines.tensorrt-llm.change_by_backend.pytorch, evidence of "
        "2025-06-18 (529 days before 2026-11-29): older than 183 days, re-verify it upstream"
    )
    # On the TensorRT backend that fact is not used: the oldest is another.
    other = _weekly_changes(tmp_path / "trt", "tensorrt")
    assert other.measurements["catalog.oldest_fact"] != m["catalog.oldest_fact"]


def test_fresh_catalog_evidence_arms_the_trigger_for_when_it_grows_stale(tmp_path: Path) -> None:
    """A team catalog whose every dated fact rests on evidence of 2026-11-01: the oldest used
    is 28 days old on 2026-11-29, so the trigger waits for it to pass 183 days."""
    fresh = re.sub(
        r"evidence_date: \d{4}-\d{2}-\d{2}", "evidence_date: 2026-11-01", _bundled_text()
    )
    fresh = re.sub(r"date: \d{4}-\d{2}-\d{2}\}", "date: 2026-11-01}", fresh)
    path = tmp_path / "catalog.yaml"
    path.write_text(fresh)
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {"deployment": "datacenter", "hardware": ["nvidia"]},
        decision={"catalog": str(path)},
    )
    assert record.measurements["catalog.oldest_fact_age_days"] == 28
    stale = next(t for t in record.triggers if t.id.startswith("catalog.stale"))
    assert (stale.id, stale.comparator, stale.threshold, stale.status) == (
        "catalog.stale.enters",
        ">",
        183,
        "not_fired",
    )
    assert rule(record, "catalog_age").fired is False
