"""Decisions resting on the catalog's facts of December 2026: TensorRT-LLM has one backend (a
model change restarts it, no build; an old manifest naming its removed TensorRT backend is read
and said to be out of date), the fact kinds a decision can now rest on (a minimum CUDA release
per engine version, multi-node serving, expert parallelism, a Neuron plugin), llama.cpp's
default slots, and the catalog-age trigger reading the oldest fact used, an undated one first.

Costs are worked by hand from the fixtures (tests/decision_fixtures.py): the steady traffic
peaks at 20 req/s; a sweep bracketed at c req/s on one $3/h GPU needs ⌈20 ÷ c⌉ replicas at
$3 × 730 h = $2,190 each a month. Weekly model changes are 13 a quarter, 13/3 a month; at
$12,000 an engineer-week an hour costs $300.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest

from pipeline.decision.catalog import _bundled_text
from pipeline.decision.result import DecisionRecord
from pipeline.decision.triggers import crossed
from pipeline.errors import ConfigError
from tests.decision_fixtures import (
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

WEEKLY = 13.0
FIXED_NVIDIA_FLEET = {
    "deployment": "datacenter",
    "hardware": ["nvidia"],
    "fixed_sku": True,
    "models": ["m"],
    "model_changes_per_quarter": WEEKLY,
    "engineer_week_usd": 12_000,
}


def _weekly_changes(tmp_path: Path, backend: str | None) -> DecisionRecord:
    """vLLM at 5 req/s (4 replicas, $8,760) against TensorRT-LLM at 10 (2 replicas, $4,380)."""
    return decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 10, backend=backend)],
        FIXED_NVIDIA_FLEET,
    )


def test_a_tensorrt_llm_model_change_is_a_restart_and_weekly_churn_leaves_its_branch(
    tmp_path: Path,
) -> None:
    """A change restarts TensorRT-LLM, 4 engineer-hours (no GPU build): 13/3 × 4 × $300 =
    $5,200 a month; vLLM 13/3 × 2 × $300 = $2,600. Totals $4,380 + $5,200 = $9,580 against
    $8,760 + $2,600 = $11,360: TensorRT-LLM, 18.6 % cheaper, wins on cost. Weekly changes keep
    the tree from pointing to it first (a new architecture waits for TensorRT-LLM), not the
    cost ranking from choosing it."""
    record = _weekly_changes(tmp_path, "pytorch")
    churn = rule(record, "model_churn")
    assert churn.fired is False and churn.evidence["tensorrt_llm_change"] == "restart"
    assert (
        "models change 13 times a quarter (stable: ≤ 1), and a model of a new architecture runs "
        "on TensorRT-LLM only once it implements it" in churn.effect
    )
    trt, vllm = candidate(record, "tensorrt-llm"), candidate(record, "vllm")
    assert trt.benchmark.startswith("tensorrt-llm 1.0 pytorch / ")  # the backend names it
    # What remains real on a change is said, not charged.
    assert any(
        r.startswith("not charged per model change: quantisation step (30 GPU-minutes and 2 ")
        for r in trt.reasons
    )
    assert any(r.startswith("not charged per model change: new-architecture") for r in trt.reasons)
    assert trt.monthly_change_cost_usd == pytest.approx(5_200)
    assert trt.monthly_total_usd == pytest.approx(9_580)
    assert vllm.monthly_total_usd == pytest.approx(11_360)
    assert record.recommendation.engine == "tensorrt-llm"
    assert trt.switch_cost_usd == pytest.approx(3 * 12_000)  # 3 engineer-weeks, one backend


def test_an_old_manifest_naming_the_removed_tensorrt_backend_is_read_and_said_to_be_gone(
    tmp_path: Path,
) -> None:
    """The same TensorRT-LLM sweep, its manifest saying backend: tensorrt (from before July
    2026): read, costed like any TensorRT-LLM deployment (a restart per change, no build), and
    the answer resting on it is provisional until it is re-benchmarked on PyTorch."""
    record = _weekly_changes(tmp_path, "tensorrt")
    trt = candidate(record, "tensorrt-llm")
    assert (
        "its benchmark ran on the tensorrt backend, which no longer exists: the TensorRT engine "
        "backend (trtllm-build, --backend tensorrt) was removed: PyTorch is the sole execution "
        "backend (2026-07-02); re-benchmark on pytorch" in trt.reasons
    )
    assert trt.monthly_change_cost_usd == pytest.approx(5_200)  # no build charged
    rec = record.recommendation
    assert rec.engine == "tensorrt-llm" and rec.confidence == "provisional"
    assert (
        "TensorRT-LLM's benchmark ran on its tensorrt backend, removed 2026-07-02: re-benchmark "
        "on pytorch" in rec.confidence_reasons
    )


def test_without_a_backend_the_change_cost_is_still_known(tmp_path: Path) -> None:
    record = _weekly_changes(tmp_path, None)
    trt = candidate(record, "tensorrt-llm")
    assert trt.monthly_change_cost_usd == pytest.approx(5_200)
    assert not any("model-change cost unknown" in r for r in trt.reasons)


def test_a_backend_the_catalog_does_not_know_names_the_manifest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _weekly_changes(tmp_path, "onnx")
    manifest = tmp_path / "bench-results" / "1-tensorrt-llm" / "enginefit-bench.yaml"
    assert str(caught.value).startswith(
        f"{manifest}: backend: TensorRT-LLM has no backend 'onnx' in the engine catalog "
        "(its backends are pytorch, _autodeploy)"
    )


def test_a_neuron_fleet_gets_vllm(tmp_path: Path) -> None:
    """AWS Trainium only: vLLM runs there through its vllm-neuron plugin (beta), TGI's Neuron
    support is in maintenance mode, nothing else runs on Neuron: vLLM, the plugin said."""
    record = decide_on(
        tmp_path, steady_traffic(), [], {"deployment": "datacenter", "hardware": ["neuron"]}
    )
    rec = record.recommendation
    assert rec.engine == "vllm" and rec.confidence == "provisional"
    assert statuses(record) == {
        "vllm": "recommended",
        "sglang": "excluded",
        "tensorrt-llm": "excluded",
        "llama.cpp": "excluded",
        "ollama": "excluded",
        "tgi": "excluded",
    }
    assert any(
        r.startswith("maintenance mode since 2025-12-11") for r in candidate(record, "tgi").reasons
    )
    assert (
        "support not first-class on neuron (plugin; the vllm-project/vllm-neuron plugin, in "
        "beta: the path AWS recommends for serving LLMs on Trainium (Trn2, Trn3))"
        in candidate(record, "vllm").reasons
    )


def test_a_team_pinned_to_cuda_12_gets_no_current_sglang(tmp_path: Path) -> None:
    """SGLang at 6 req/s would be cheaper than vLLM at 5, but its current release (0.5.23)
    needs CUDA 13 from 0.5.20 on; vLLM's +cu129 wheels run on CUDA 12: vLLM. TensorRT-LLM's
    current release is built for CUDA 13 too. A trigger watches whether vLLM's next release
    leaves CUDA 12."""
    requirements = {"deployment": "datacenter", "hardware": ["nvidia"], "cuda_version": "12.8"}
    record = decide_on(
        tmp_path, steady_traffic(), [sweep("vllm", 5), sweep("sglang", 6)], requirements
    )
    assert record.recommendation.engine == "vllm"
    assert statuses(record)["sglang"] == statuses(record)["tensorrt-llm"] == "excluded"
    assert candidate(record, "sglang").reasons[0] == (
        "cuda: SGLang 0.5.23 needs CUDA 13, driver 580 or later (from 0.5.20 on: the CUDA 12 "
        "lane is retired: v0.5.19 is the last release with CUDA 12 wheels and images); your "
        "NVIDIA fleet runs CUDA 12.8: no current SGLang"
    )
    cuda = rule(record, "cuda")
    assert cuda.fired is True and cuda.evidence["excluded"] == ["sglang", "tensorrt-llm"]
    assert cuda.effect.endswith(
        "; the catalog states no CUDA requirement for llama.cpp, ollama, tgi"
    )
    watch = next(t for t in record.triggers if t.id == "engine.cuda[vllm]")
    assert (watch.metric, watch.comparator, watch.threshold, watch.value.value, watch.status) == (
        "catalog.min_cuda_major[vllm]",
        ">",
        12,
        12,
        "not_fired",
    )
    # On CUDA 13 nothing is excluded for CUDA and the cheaper SGLang wins.
    current = decide_on(
        tmp_path / "13",
        steady_traffic(),
        [sweep("vllm", 5), sweep("sglang", 6)],
        {**requirements, "cuda_version": "13"},
    )
    assert current.recommendation.engine == "sglang" and rule(current, "cuda").fired is False


def test_a_multi_node_moe_requirement_excludes_llama_cpp_and_ollama(tmp_path: Path) -> None:
    """A mixture-of-experts model too large for one node: multi-node serving and expert
    parallelism. llama.cpp (RPC over the network is a fragile proof of concept; no expert
    parallelism), Ollama and TGI cannot; vLLM, SGLang and TensorRT-LLM can."""
    requirements = {
        "deployment": "datacenter",
        "hardware": ["nvidia"],
        "features": ["multi_node", "expert_parallelism"],
    }
    record = decide_on(tmp_path, steady_traffic(), [], requirements)
    states = statuses(record)
    assert states["llama.cpp"] == states["ollama"] == states["tgi"] == "excluded"
    assert "features: lacks expert_parallelism" in candidate(record, "llama.cpp").reasons
    assert "features: lacks multi_node, expert_parallelism" in candidate(record, "ollama").reasons
    assert any(
        r.startswith("multi_node limited: the RPC backend")
        for r in candidate(record, "llama.cpp").reasons
    )
    assert {e for e, s in states.items() if s != "excluded"} == {"vllm", "sglang", "tensorrt-llm"}
    assert rule(record, "features").effect.startswith(
        "required multi_node, expert_parallelism; excluded"
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
    oldest is TGI's (the repository's last commit, 2026-01-08): 325 days, past the 183-day
    limit. The rationale says to re-verify it and names it; the trigger is armed for its
    re-verification (a trigger fired from the start would reopen every decision)."""
    record = _weekly_changes(tmp_path, "pytorch")
    m = record.measured
    assert m("catalog.oldest_fact") == "engines.tgi.change"
    assert m("catalog.oldest_fact_date") == "2026-01-08"
    assert m("catalog.oldest_fact_age_days") == 325
    assert m("catalog.undated_facts_used") == 0
    assert record.catalog["oldest_fact_used"] == "engines.tgi.change"
    stale = next(t for t in record.triggers if t.id.startswith("catalog.stale"))
    assert (stale.id, stale.metric, stale.comparator, stale.threshold, stale.value.value) == (
        "catalog.stale.leaves",
        "catalog.oldest_fact_age_days",
        "<=",
        183,
        325,
    )
    assert stale.status == "not_fired" and record.recommendation.state == "decided"
    age = rule(record, "catalog_age")
    assert age.fired is True
    assert age.effect.startswith(
        "the oldest fact used is engines.tgi.change, evidence of 2026-01-08 (325 days before "
        "2026-11-29): older than 183 days, re-verify it upstream"
    )


def _fresh_catalog(path: Path, *, undated: str | None = None) -> Path:
    """The bundled catalog with every evidence date 2026-11-01, and optionally the fact whose
    line starts with ``undated`` left without one."""
    fresh = re.sub(
        r"evidence_date: \d{4}-\d{2}-\d{2}", "evidence_date: 2026-11-01", _bundled_text()
    )
    fresh = re.sub(r"date: \d{4}-\d{2}-\d{2}\}", "date: 2026-11-01}", fresh)
    if undated is not None:
        line = next(x for x in fresh.splitlines() if x.strip().startswith(undated))
        fresh = fresh.replace(line, line.replace("2026-11-01", "undated"))
    path.write_text(fresh)
    return path


def test_fresh_catalog_evidence_arms_the_trigger_for_when_it_grows_stale(tmp_path: Path) -> None:
    """A team catalog whose every dated fact rests on evidence of 2026-11-01: the oldest used
    is 28 days old on 2026-11-29, so the trigger waits for it to pass 183 days."""
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5)],
        {"deployment": "datacenter", "hardware": ["nvidia"]},
        decision={"catalog": str(_fresh_catalog(tmp_path / "catalog.yaml"))},
    )
    assert record.measured("catalog.oldest_fact_age_days") == 28
    stale = next(t for t in record.triggers if t.id.startswith("catalog.stale"))
    assert (stale.id, stale.comparator, stale.threshold, stale.status) == (
        "catalog.stale.enters",
        ">",
        183,
        "not_fired",
    )
    assert rule(record, "catalog_age").fired is False


def test_an_undated_fact_counts_as_the_oldest_and_fires_the_age_trigger(tmp_path: Path) -> None:
    """Last quarter's decision rested on fresh facts (its trigger waits for them to pass 183
    days); this quarter's team catalog leaves vLLM's status undated: an undated fact is the
    oldest evidence there is, so last quarter's trigger fires and this decision says to date it."""
    nvidia = {"deployment": "datacenter", "hardware": ["nvidia"]}
    before = tmp_path / "before"
    decide_on(
        before,
        steady_traffic(),
        [sweep("vllm", 5)],
        nvidia,
        decision={"catalog": str(_fresh_catalog(tmp_path / "fresh.yaml"))},
    )
    previous = before / "data" / "w" / "decision" / "decision.json"
    record = decide_on(
        tmp_path / "now",
        steady_traffic(),
        [sweep("vllm", 5)],
        nvidia,
        previous=previous,
        decision={
            "catalog": str(
                _fresh_catalog(tmp_path / "undated.yaml", undated="status: {state: active")
            )
        },
    )
    m = record.measured
    assert (m("catalog.oldest_fact"), m("catalog.oldest_fact_age_days")) == (
        "engines.vllm.status",
        "undated",
    )
    age = rule(record, "catalog_age")
    assert age.fired is True and age.effect.startswith(
        "1 fact(s) used carry no evidence date, engines.vllm.status first: an undated fact "
        "counts as the oldest evidence there is"
    )
    assert record.previous is not None and "catalog.stale.enters" in record.previous.fired
    assert record.recommendation.state == "revisit"
    assert crossed("undated", ">", 183) is True and crossed("undated", "<=", 183) is False
