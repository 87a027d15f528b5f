"""The decision rules an expert would sign: a mixed fleet with and without one
engine across it, a laptop, one user on datacenter GPUs, untrusted tenants whose isolation
the recommendation carries with its cost, the routing layer chosen by the team's platform, and
tie-break reasons that name what was equal and what decided.

Each is a whole decision: generated traffic and vLLM ``bench serve`` result files with sidecar
manifests go through the real stages (tests/decision_fixtures.py). Costs are worked by hand:
a sweep bracketed at c req/s with 200 output tokens on one $3/h GPU needs ⌈peak ÷ c⌉ replicas
at $3 × 730 h a month each.
"""

from __future__ import annotations

import json
from functools import cache, partial
from pathlib import Path
from typing import Any

import pytest

from pipeline.capacity.result import ServingModel
from pipeline.costing import HOURS_PER_MONTH
from pipeline.decision.present import rationale_text
from pipeline.decision.result import DecisionRecord
from pipeline.decision.stage import read_previous
from pipeline.report.sections.memo import decision_memo
from tests.capacity_scenarios import fitted
from tests.decision_fixtures import (
    GPU_HOUR_USD,
    LLAMA_8B_ON_H100,
    candidate,
    capacity_of,
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

MIXED = {"deployment": "datacenter", "hardware": ["nvidia", "amd"]}
NVIDIA_DATACENTER = {"deployment": "datacenter", "hardware": ["nvidia"]}
# Llama-3.1-70B in 4 bits on one 48 GiB GPU (an L40S): 70 × 10⁹ bytes = 65.2 GiB at 8 bits
# (FP8/INT8, which every datacenter engine serves) does not fit 48 × 0.92 − 3 = 41.2 GiB
# usable; 70 × 10⁹ × 0.5 bytes = 32.6 GiB does.
LLAMA_70B_4BIT_ON_L40S = {
    **LLAMA_8B_ON_H100,
    "gpu_memory_gib": 48.0,
    "model_params_billion": 70.0,
    "weight_bytes": 0.5,
    "layers": 80,
}


@cache
def fitted_model() -> ServingModel:
    """The serving model fitted on the independent simulator's short-prompt sweep."""
    fit = fitted("short")
    assert isinstance(fit, ServingModel), fit
    return fit


def one_user() -> Any:
    """One request at a time (0.2 req/s, 2 s each): peak concurrency 1."""
    return traffic(60, rate_rps=0.2, e2e_s=2.0)


def conversations() -> Any:
    """Multi-turn chat over a shared 1,024-token system prompt (as in
    tests/test_decision_scenarios.py): prefix-heavy, and affinity routing over 4 replicas
    saves far more than the 10 % routing threshold."""
    return traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64)


@pytest.mark.parametrize(
    ("one_engine", "trt_status", "top", "headline_part"),
    [
        # One engine across the fleet: TensorRT-LLM cannot serve the AMD GPUs, so it is out and
        # vLLM (4 replicas at 5 req/s for the 20 req/s peak, $8,760 a month) is the answer.
        (True, "excluded", "vllm", "vLLM: "),
        # An engine per part of the fleet: TensorRT-LLM stays in, costed for the NVIDIA part
        # (3 replicas at 7 req/s, $6,570, more than 10 % below vLLM's $8,760), and the record
        # says the AMD part needs another engine.
        (
            False,
            "recommended",
            "tensorrt-llm",
            "TensorRT-LLM for the nvidia part of the fleet (the amd part needs another engine)",
        ),
    ],
)
def test_a_mixed_fleet_excludes_or_splits_an_engine_that_serves_part_of_it(
    tmp_path: Path, one_engine: bool, trt_status: str, top: str, headline_part: str
) -> None:
    record = decide_on(
        tmp_path,
        steady_traffic(),
        [sweep("vllm", 5), sweep("tensorrt-llm", 7)],
        {**MIXED, "one_engine_across_fleet": one_engine},
    )
    assert record.recommendation.engine == top
    assert record.recommendation.headline.startswith(headline_part)
    trt = candidate(record, "tensorrt-llm")
    assert trt.status == trt_status
    hardware = rule(record, "hardware")
    assert hardware.evidence["partial_fleet"] == ["tensorrt-llm"]
    assert hardware.evidence["one_engine_across_fleet"] is one_engine
    if one_engine:
        assert trt.reasons[0] == (
            "hardware: runs on nvidia but not amd, and one engine must serve the whole fleet "
            "(requirements.one_engine_across_fleet)"
        )
        assert trt.monthly_cost_usd == pytest.approx(3 * GPU_HOUR_USD * HOURS_PER_MONTH)
        assert hardware.fired is True
    else:
        assert trt.reasons[0].startswith(
            "serves only the nvidia part of the fleet (requirements.one_engine_across_fleet: "
            "false): costed on that hardware (its benchmark's)"
        )
        assert trt.monthly_cost_usd == pytest.approx(6_570)
        assert candidate(record, "vllm").monthly_cost_usd == pytest.approx(8_760)
        assert "stay in for that part" in hardware.effect
        assert trt.reasons[0].endswith("; the amd part needs another engine")


def test_a_laptop_gets_llama_cpp_and_no_routing_advice(tmp_path: Path) -> None:
    """One person on an Apple laptop: llama.cpp, low concurrency on local hardware applies, and
    even with a prefix-aware routing scenario simulated there is nothing to route between."""
    record = decide_on(
        tmp_path,
        one_user(),
        [],
        {"deployment": "local", "hardware": ["apple"], "platform": {"orchestrator": "none"}},
    )
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == ("llama.cpp", "ollama")
    concurrency = rule(record, "concurrency")
    assert concurrency.fired is True
    assert concurrency.effect.startswith("peak 1 ≤ 2 on local hardware")
    routing = record.routing
    assert (routing.recommended, routing.layer, rec.routing_layer) == (False, None, None)
    assert routing.reason.startswith("a local deployment runs one replica on one machine")
    assert "routing" not in rec.headline


@pytest.mark.parametrize(
    ("kv_cache", "fired", "effect", "engines"),
    [
        # The weights fit at 8 bits (BF16 even): vLLM and SGLang serve one user well.
        (
            LLAMA_8B_ON_H100,
            False,
            "peak 1 ≤ 2 on datacenter GPUs that hold the weights at 8 bits or wider: vLLM and "
            "SGLang serve one user well",
            ("vllm", "sglang"),
        ),
        # Whether the weights fit is unknown: said, and the tree does not guess llama.cpp.
        (
            None,
            None,
            "unknown: peak 1 ≤ 2; whether that points to llama.cpp / Ollama depends on the "
            "hardware and on whether the weights fit only below 8 bits: set requirements.kv_cache",
            ("vllm", "sglang"),
        ),
        # 70B parameters fit one L40S only below 8 bits: llama.cpp's GGUF formats come in.
        (
            LLAMA_70B_4BIT_ON_L40S,
            True,
            "peak 1 ≤ 2 with weights that fit only below 8 bits (70B parameters at 8 bits take "
            "65.2 GiB per GPU of 41.2 GiB usable",
            ("llama.cpp", "ollama"),
        ),
    ],
)
def test_one_user_on_datacenter_gpus_points_to_llama_cpp_only_when_the_weights_need_it(
    tmp_path: Path,
    kv_cache: dict[str, float] | None,
    fired: bool | None,
    effect: str,
    engines: tuple[str, str],
) -> None:
    record = decide_on(
        tmp_path, one_user(), [], {**NVIDIA_DATACENTER, "kv_cache": kv_cache}, replicas=(1,)
    )
    concurrency = rule(record, "concurrency")
    assert concurrency.fired is fired
    assert concurrency.effect.startswith(effect)
    assert concurrency.evidence["peak_concurrency"] == 1
    rec = record.recommendation
    assert (rec.engine, rec.runner_up) == engines
    assert "excluded" not in {statuses(record)[e] for e in ("vllm", "sglang")}


def test_one_user_on_datacenter_gpus_keeps_a_measured_vllm(tmp_path: Path) -> None:
    """Peak concurrency 1 on H100s with vLLM benchmarked: vLLM is recommended on its cost, not
    pushed behind an unbenchmarked llama.cpp."""
    record = decide_on(
        tmp_path,
        one_user(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "kv_cache": LLAMA_8B_ON_H100},
        replicas=(1,),
    )
    rec = record.recommendation
    assert rec.engine == "vllm"
    assert statuses(record)["llama.cpp"] == "viable"
    assert not any("llama.cpp" in r for r in rec.confidence_reasons)


def tenants_sharing_a_system_prompt() -> Any:
    """4 conversations of 10 turns, one tenant each, over a 64-block (1,024-token) system
    prompt; 8 new blocks a turn, 1 req/s, 1 s each (one replica at vLLM's 5 req/s).

    Turn k (0-based) of a conversation sends 64 + 8(k + 1) blocks; all prompts hold
    4 × Σₖ (72 + 8k) = 4 × (720 + 360) = 4,320 blocks. With one cache big enough for all, turn
    k ≥ 1 hits its 64 + 8k earlier blocks (4 × Σ_{k=1..9} (64 + 8k) = 4 × 936 = 3,744 blocks)
    shared or isolated alike; the first turns of the 2nd, 3rd and 4th conversations also hit the
    system prompt only when the cache is shared: 3 × 64 = 192 blocks more.
    """
    return traffic(40, rate_rps=1, e2e_s=1.0, conversations=4, system_blocks=64, tenants=4)


def test_untrusted_tenants_get_isolation_in_the_recommendation_with_its_cost(
    tmp_path: Path,
) -> None:
    record = decide_on(
        tmp_path,
        tenants_sharing_a_system_prompt(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "untrusted_tenants": True},
        compare_isolation=True,
    )
    shared, isolated = (3_744 + 192) / 4_320, 3_744 / 4_320
    advice = record.recommendation.isolation
    assert advice is not None
    assert advice.replicas == 1  # the fleet: 1 req/s on one replica of 5 req/s
    assert advice.hit_ratio_shared == pytest.approx(shared, rel=1e-5)
    assert advice.hit_ratio_isolated == pytest.approx(isolated, rel=1e-5)
    # No capacity stage: priced through the benchmark's sustained prompt-token rate at its
    # capacity (5 req/s × 128 prompt tokens = 640 tokens/s on one $3/h GPU). Isolation loses
    # 192 blocks × 16 tokens over 40 requests = 76.8 prompt tokens a request, prefilled again.
    rate = record.measured("shape.arrivals.mean_rate_rps")
    tokens = 192 * 16 / 40 * rate * HOURS_PER_MONTH * 3600
    dollars = tokens / 640 / 3600 * GPU_HOUR_USD
    assert advice.monthly_usd_cost == pytest.approx(dollars, rel=1e-4)
    assert advice.action.startswith("isolate the prefix cache per tenant")
    headline = record.recommendation.headline
    assert (
        f". Untrusted tenants: isolate the prefix cache per tenant: a per-request cache salt "
        f"carrying the tenant, or separate replicas per tenant (hit ratio {shared:.1%} shared "
        f"vs {isolated:.1%} isolated at 1 replica; about ${dollars:,.0f} a month of prefill)"
    ) in headline
    assert record.isolation.recommended is True and record.isolation.replicas == 1
    # Page 1 of the document lists it among the next steps, with its cost.
    steps = decision_memo(record, None).next_steps
    assert f"Untrusted tenants: {advice.action} ({advice.cost})." in steps


def test_isolation_is_priced_through_the_fitted_model_at_the_fleets_replicas(
    tmp_path: Path,
) -> None:
    """Long multi-turn prompts (~3.8k tokens) across 4 tenants over the 128-token vLLM sweep
    with the capacity stage's serving model: the workload's own fleet has several replicas, and
    isolation is compared at that replica count and priced through the model there."""
    frame = traffic(
        410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64, turn_blocks=32, tenants=4
    )
    record = decide_on(
        tmp_path,
        frame,
        [sweep("vllm", 40)],
        {**NVIDIA_DATACENTER, "untrusted_tenants": True},
        capacity=capacity_of(fitted_model()),
        compare_isolation=True,
        replicas=(1, 2, 4),
    )
    vllm = candidate(record, "vllm")
    assert vllm.cost_basis == "workload" and vllm.replicas is not None and vllm.replicas > 1
    advice = record.recommendation.isolation
    # Compared at the simulated count nearest the fleet's (by ratio): 41 s of traffic has no
    # complete 60-s window, so the peak is the 10-s one's and the fleet 3 replicas, nearest 4.
    assert vllm.replicas == 3
    assert advice is not None and advice.replicas == 4
    assert record.isolation.fleet_replicas == vllm.replicas
    assert record.isolation.method is not None
    assert f"through the fitted serving model at {vllm.replicas} replicas" in (
        record.isolation.method
    )
    assert advice.monthly_usd_cost == record.isolation.monthly_usd_cost
    assert advice.monthly_usd_cost is not None
    # Prefill the isolated cache no longer saves: some, never more than the fleet's bill.
    assert vllm.monthly_cost_usd is not None
    assert 0 < advice.monthly_usd_cost < vllm.monthly_cost_usd
    assert f"about ${advice.monthly_usd_cost:,.0f} a month of prefill)" in (
        record.recommendation.headline
    )


def test_isolation_for_a_routed_fleet_is_compared_with_the_routing_it_runs(tmp_path: Path) -> None:
    """A fleet of 2 with affinity routing recommended: isolation is compared at 4 replicas
    (the only simulated count with routing; one replica is not like a routed fleet) under
    affinity, not on one round-robin replica."""
    frame = traffic(410, rate_rps=10, e2e_s=2.0, conversations=41, system_blocks=64, tenants=4)
    record = decide_on(
        tmp_path,
        frame,
        [sweep("vllm", 4, input_tokens_mean=1_728)],
        {**NVIDIA_DATACENTER, "untrusted_tenants": True},
        compare_isolation=True,
    )
    assert record.routing.recommended is True and record.routing.fleet_replicas == 3
    advice = record.recommendation.isolation
    assert advice is not None and advice.replicas == 4
    assert "at 4 replicas, the simulated count nearest the fleet's 3" in advice.cost
    scenarios = json.loads((tmp_path / "data" / "w" / "simulation" / "scenarios.json").read_text())
    rows = scenarios["scenarios"] if isinstance(scenarios, dict) else scenarios
    hit = {
        s["tenant_isolation"]: s["hit_ratio"]
        for s in rows
        if s["replicas"] == 4 and s["routing"] == "affinity"
    }
    assert (advice.hit_ratio_shared, advice.hit_ratio_isolated) == (
        pytest.approx(hit[False]),
        pytest.approx(hit[True]),
    )


def test_isolation_without_both_replays_is_advised_with_its_cost_unknown(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        tenants_sharing_a_system_prompt(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "untrusted_tenants": True},
    )
    advice = record.recommendation.isolation
    assert advice is not None and advice.monthly_usd_cost is None
    assert advice.cost == (
        "hit-rate cost unknown: set simulation.compare_isolation: true to replay with and "
        "without isolation"
    )
    assert f"({advice.cost})" in record.recommendation.headline


def test_trusted_tenants_carry_no_isolation(tmp_path: Path) -> None:
    record = decide_on(
        tmp_path,
        tenants_sharing_a_system_prompt(),
        [sweep("vllm", 5)],
        {**NVIDIA_DATACENTER, "untrusted_tenants": False},
        compare_isolation=True,
    )
    assert record.recommendation.isolation is None
    assert "Untrusted tenants" not in record.recommendation.headline


@pytest.mark.parametrize(
    ("platform", "layer", "alternatives", "choice"),
    [
        # Kubernetes with an Inference Extension gateway: llm-d plugs into it.
        (
            {"orchestrator": "kubernetes", "gateway": "inference-extension"},
            "llm-d",
            ["kserve", "dynamo", "vllm-production-stack"],
            "llm-d runs on Kubernetes, plugs into your gateway",
        ),
        # Kubernetes without one: the exact layers that bring their own front end; Dynamo also
        # serves the runner-up SGLang (the production stack serves vLLM only).
        (
            {"orchestrator": "kubernetes", "gateway": "none"},
            "dynamo",
            ["vllm-production-stack"],
            "NVIDIA Dynamo runs on Kubernetes, routes on the engines' KV events (exact, as "
            "simulated), also serves SGLang, so a switch keeps the router",
        ),
        # A Ray cluster: Ray Serve LLM.
        ({"orchestrator": "ray", "gateway": None}, "ray-serve", [], "Ray Serve LLM runs on a Ray"),
        # Kubernetes, gateway unknown: whether llm-d can plug in decides, so nothing is chosen.
        (
            {"orchestrator": "kubernetes", "gateway": None},
            None,
            ["dynamo", "llm-d", "vllm-production-stack", "kserve"],
            "whether a layer can use your gateway decides: set requirements.platform.gateway",
        ),
        # Platform unknown: the layers that serve vLLM, listed with where each runs.
        (
            {"orchestrator": None, "gateway": None},
            None,
            ["dynamo", "llm-d", "vllm-production-stack", "kserve", "ray-serve"],
            "the layer depends on your platform: set requirements.platform (orchestrator, "
            "gateway) to choose among NVIDIA Dynamo (exact prefix routing; on Kubernetes or "
            "plain hosts)",
        ),
    ],
)
def test_the_routing_layer_is_chosen_by_the_teams_platform(
    tmp_path: Path,
    platform: dict[str, str | None],
    layer: str | None,
    alternatives: list[str],
    choice: str,
) -> None:
    """Prefix-heavy chat on vLLM (4 req/s a replica; 410 requests in the peak minute, 6.8
    req/s, need 2): routing saves far more than the threshold; the platform decides the
    layer."""
    record = decide_on(
        tmp_path,
        conversations(),
        [sweep("vllm", 4, input_tokens_mean=1_728)],
        {**NVIDIA_DATACENTER, "platform": platform},
    )
    routing = record.routing
    assert routing.recommended is True and routing.fleet_replicas == 3
    assert (routing.layer, record.recommendation.routing_layer) == (layer, layer)
    assert routing.alternatives == alternatives
    assert routing.layer_choice is not None and routing.layer_choice.startswith(choice)
    effect = rule(record, "routing").effect
    assert effect.startswith(f"recommend {layer}: " if layer else "recommended; ")
    assert f"\nlayer: {routing.layer_choice[:40]}" in rationale_text(record)
    headline = record.recommendation.headline
    assert headline.startswith(
        "vLLM with prefix-aware routing ("
        + (
            "its layer depends on your platform: see routing)"
            if layer is None
            else f"{routing.layer_choice.split(' runs on')[0]})"
        )
    )


def test_routing_advice_for_an_unknown_fleet_size_gives_its_saving(tmp_path: Path) -> None:
    """No benchmark, so no fleet size: the saving at the largest simulated replica count (the
    only multi-replica one here) clears the threshold, so the routing layer is recommended
    with that saving, the range over the simulated counts said (tests/test_decision_routing_
    payback.py has one over several counts)."""
    record = decide_on(
        tmp_path,
        conversations(),
        [],
        {**NVIDIA_DATACENTER, "platform": {"orchestrator": "kubernetes", "gateway": "none"}},
    )
    routing = record.routing
    assert routing.recommended is True and routing.layer == "dynamo"
    assert routing.replicas == 4 and routing.prompt_tokens_saved_share is not None
    share = routing.prompt_tokens_saved_share
    assert routing.prompt_tokens_saved_share_range == [share, share]
    assert routing.worth_from_replicas == 4 and routing.fleet_replicas is None
    effect = rule(record, "routing").effect
    assert effect.startswith("recommend dynamo: NVIDIA Dynamo runs on Kubernetes")
    assert (
        "the fleet size is unknown (unknown: the recommended engine has no benchmark): over the "
        f"simulated 4 replicas it saves {share:.1%} of prompt tokens" in effect
    )
    assert "with prefix-aware routing (NVIDIA Dynamo)" in record.recommendation.headline


@pytest.mark.parametrize(
    ("requirements", "sglang_rps", "reason"),
    [
        # Equal on everything the tie-break weighs but the tree: the tree says why vLLM.
        (
            NVIDIA_DATACENTER,
            5.2,
            "SGLang and vLLM are within 4.0% on monthly GPU cost (the fleet the peak needs, before "
            "rounding up to whole replicas) (inside the 10% margin); both are actively maintained, neither runs today and both take 2 "
            "engineer-weeks to migrate to: vLLM is chosen because the decision tree puts it "
            "first: without heavy prefix sharing (0% of requests share their first 128 tokens, "
            "not above 50%) it ends at vLLM, SGLang's radix cache having little to reuse",
        ),
        # SGLang runs today: that decides, after maintenance was equal.
        (
            {**NVIDIA_DATACENTER, "current_engine": "sglang"},
            5.2,
            "SGLang and vLLM are within 4.0% on monthly GPU cost (the fleet the peak needs, before "
            "rounding up to whole replicas) (inside the 10% margin); both are actively maintained: SGLang is chosen because it runs "
            "today (no migration)",
        ),
        # vLLM's migration is dearer: migration decides, after maintenance and today's engine.
        (
            {**NVIDIA_DATACENTER, "migration_engineer_weeks": {"vllm": 3}},
            5.2,
            "SGLang and vLLM are within 4.0% on monthly GPU cost (the fleet the peak needs, before "
            "rounding up to whole replicas) (inside the 10% margin); both are actively maintained and neither runs today: SGLang is "
            "chosen because its migration is shorter (2 vs 3 engineer-weeks)",
        ),
    ],
)
def test_a_tie_names_what_was_equal_and_what_decided(
    tmp_path: Path, requirements: dict[str, Any], sglang_rps: float, reason: str
) -> None:
    """vLLM at 5 req/s and SGLang at 5.2 for the 20 req/s peak: compared before rounding to
    whole replicas (4 vs 3.85 replicas' worth of GPU time: SGLang 4.0 % cheaper), inside the
    10 % margin, a tie."""
    record = decide_on(
        tmp_path, steady_traffic(), [sweep("vllm", 5), sweep("sglang", sglang_rps)], requirements
    )
    rec = record.recommendation
    assert rec.confidence == "tie"
    assert reason in rec.confidence_reasons
    # The margin rule says the same, and what set the tie band.
    assert rule(record, "margin").effect.startswith(f"tie: {reason} (tie band 10.0%, set by the")


def test_a_version_2_record_reads_back_as_written(tmp_path: Path) -> None:
    """A version-2 record (before the recommendation carried isolation) still serves as
    --previous, and dumps exactly what its file held."""
    record = decide_on(tmp_path, steady_traffic(), [sweep("vllm", 5)], NVIDIA_DATACENTER)
    old = record.to_json()
    old["schema_version"] = 2
    old["recommendation"].pop("isolation")
    old["routing"].pop("layer_choice")
    for key in ("action", "replicas", "fleet_replicas"):
        old["isolation"].pop(key)
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(old))
    previous = read_previous(path)
    assert previous.schema_version == 2 and previous.to_json() == old
    assert isinstance(previous, DecisionRecord) and previous.recommendation.isolation is None
