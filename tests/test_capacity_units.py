"""The capacity core's small parts: the replica simulation's invariants, settings errors, the
result's JSON round-trip, the VP sentence, the checks and routing priced by the model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.arrays import narrow
from pipeline.capacity import checks
from pipeline.capacity.compute import (
    WorkloadRequests,
    capacity_result,
    carry_to_workload,
    routing_value,
    workload_requests,
)
from pipeline.capacity.kernels import simulate_replica
from pipeline.capacity.present import (
    BINDING_WORDS,
    candidates_table,
    model_errors_table,
    render_text,
    transfer_sentence,
)
from pipeline.capacity.result import CapacityResult, ServingModel, StepCoefficients
from pipeline.capacity.search import run_stats, sample_requests, simulate_at, slo_met
from pipeline.config import config_from_mapping, default_config
from pipeline.errors import ConfigError
from pipeline.unknown import Unknown
from tests.capacity_scenarios import CONFIG, KV_TOKENS, PRICE, SLO, fitted, workload

STEP = {
    "overhead_s": 0.005,
    "prefill_s_per_token": 1e-5,
    "attention_s_per_pair": 0.0,
    "decode_s_per_request": 1e-4,
    "context_s_per_token": 1e-8,
}


def _one(prompt: int, output: int, budget: int = 1024, **extra: float) -> tuple[float, float]:
    run = simulate_replica(
        np.array([0.0]),
        np.array([prompt]),
        np.array([prompt]),
        np.array([output]),
        token_budget=budget,
        max_batch=8,
        kv_tokens=10_000,
        **{**STEP, **extra},
    )
    return float(run.ttft_s[0]), float(run.e2e_s[0])


def test_lone_request_timing_is_the_step_formula() -> None:
    ttft, e2e = _one(500, 3)
    assert ttft == pytest.approx(0.005 + 500 * 1e-5)
    decode_step = [0.005 + 1e-4 + 1e-8 * (500 + k) for k in (1, 2)]
    assert e2e == pytest.approx(ttft + sum(decode_step))


def test_chunked_prefill_splits_a_long_prompt_and_attention_grows_with_it() -> None:
    ttft, _ = _one(2500, 1, budget=1000)  # three chunks: three steps of overhead
    assert ttft == pytest.approx(3 * 0.005 + 2500 * 1e-5)
    with_attention, _ = _one(2500, 1, budget=1000, attention_s_per_pair=1e-9)
    pairs = 1000 * 500 + 1000 * (1000 + 500) + 500 * (2000 + 250)
    assert with_attention - ttft == pytest.approx(pairs * 1e-9)


def test_kv_limit_holds_requests_back_and_oversized_ones_are_refused() -> None:
    arrivals = np.array([0.0, 0.0])
    tokens = np.array([600, 600])
    run = simulate_replica(
        arrivals,
        tokens,
        tokens,
        np.array([2, 2]),
        token_budget=4096,
        max_batch=8,
        kv_tokens=1000,
        **STEP,
    )
    assert run.wait_s[0] == 0.0 and run.wait_s[1] > 0.0  # the second waits for KV memory
    with pytest.raises(ValueError, match="KV cache"):
        simulate_replica(
            arrivals,
            tokens,
            tokens,
            np.array([2, 2]),
            token_budget=4096,
            max_batch=8,
            kv_tokens=500,
            **STEP,
        )


def test_config_errors_are_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"capacity\.headroom: .*1\.5") as err:
        config_from_mapping({"capacity": {"headroom": 1.5}})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown key capacity\.sample_size") as err:
        config_from_mapping({"capacity": {"sample_size": 10}})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="max_batch"):
        config_from_mapping({"capacity": {"max_batch": 4096, "token_budget": 2048}})
    assert config_from_mapping({"capacity": {"n_plus_one": True}}).capacity.n_plus_one
    assert not default_config().capacity.n_plus_one


def _result() -> CapacityResult:
    model = fitted("short")
    mix = workload("long", 0.3)
    candidate = carry_to_workload(
        "vllm",
        model,
        mix,
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=12.0,
        mean_rate_rps=4.0,
        config=CONFIG,
        benchmark_cost_per_1m_output_usd=0.145,
    )
    unknown = carry_to_workload(
        "sglang",
        Unknown(reason="no benchmark"),
        mix,
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=12.0,
        mean_rate_rps=4.0,
        config=CONFIG,
    )
    return capacity_result(
        "t", SLO, mix, [candidate, unknown], CONFIG, peak_rate_rps=12.0, mean_rate_rps=4.0
    )


def test_result_round_trips_through_json() -> None:
    result = _result()
    text = json.dumps(result.to_json())
    again = CapacityResult.from_json(json.loads(text))
    assert again == result
    assert isinstance(again.candidates[1].workload_capacity_rps, Unknown)


def test_checks_pass_on_a_real_result() -> None:
    result = _result()
    for check in (
        checks.capacity_within_band,
        checks.no_zero_stands_for_unknown,
        checks.fit_errors_reported,
        checks.far_transfers_are_provisional,
    ):
        assert check(result) == [], check.__name__


def test_vp_sentence_and_tables() -> None:
    result = _result()
    sentence = transfer_sentence(result.candidates[0])
    assert sentence.startswith("Measured at 201-token prompts; your prompts are 20× longer: ")
    assert "req/s per replica (" in sentence and "provisional" in sentence
    binding = result.candidates[0].binding
    assert not isinstance(binding, Unknown)
    assert f", bound by {BINDING_WORDS[binding.limit]}" in sentence
    text = render_text(result)
    assert "- limits: prefill budget 1,024 tokens a step (configuration: capacity section)" in text
    assert f"- what binds: {binding.description}" in text
    assert "- self-check: passed (" in text
    assert transfer_sentence(result.candidates[1]) == "sglang: capacity unknown — no benchmark"
    table = candidates_table(result)
    # a cell is the bare word; the reason is the sentence's
    assert "| sglang | unknown | unknown |" in table and "$/1M output" in table
    assert "no benchmark" not in table
    model = result.candidates[0].serving_model
    assert isinstance(model, ServingModel)
    assert model_errors_table(model).count("\n") == 1 + len(model.point_errors)


def test_fleet_follows_the_headroom_and_n_plus_one() -> None:
    model = fitted("short")
    mix = workload("short")
    costs = []
    for config in (CONFIG, CONFIG.replace(headroom=0.5), CONFIG.replace(n_plus_one=True)):
        c = carry_to_workload(
            "vllm",
            model,
            mix,
            SLO,
            kv_tokens=KV_TOKENS,
            gpu_hour_usd=PRICE,
            peak_rate_rps=100.0,
            mean_rate_rps=40.0,
            config=config,
        )
        assert not isinstance(c.cost, Unknown) and isinstance(c.workload_capacity_rps, float)
        costs.append(c.cost)
        expected = int(np.ceil(100.0 / (c.workload_capacity_rps * config.headroom)))
        assert c.cost.replicas == expected + (1 if config.n_plus_one else 0)
        assert c.cost.monthly_cost_usd == pytest.approx(c.cost.replicas * PRICE * 730)
        assert c.cost.peak_utilisation <= config.headroom + 1e-9
    assert costs[1].replicas > costs[0].replicas and costs[2].replicas == costs[0].replicas + 1


def test_routing_saves_prefill_time_and_ttft() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    value = routing_value(
        model,
        workload("long"),
        cached_share_worse=0.07,
        cached_share_better=0.23,
        replicas=4,
        rate_rps=8.0,
        mean_rate_rps=4.0,
        gpu_hour_usd=PRICE,
        kv_tokens=KV_TOKENS,
        slo=SLO,
        config=CONFIG,
    )
    tokens = 4.0 * workload("long").prompt_mean * 3600 * 730
    expected_hours = model.coefficients.prefill_s_per_token * 0.16 * tokens / 3600
    assert value.prefill_gpu_hours_saved_per_month == pytest.approx(expected_hours)
    assert value.monthly_usd_saved == pytest.approx(expected_hours * PRICE)
    assert isinstance(value.ttft_p95_ms_saved, float) and value.ttft_p95_ms_saved > 0
    with pytest.raises(ValueError, match="worse ≤ better"):
        routing_value(
            model,
            workload("long"),
            cached_share_worse=0.3,
            cached_share_better=0.2,
            replicas=4,
            rate_rps=8.0,
            mean_rate_rps=4.0,
            gpu_hour_usd=PRICE,
            kv_tokens=KV_TOKENS,
            slo=SLO,
            config=CONFIG,
        )


def test_a_whole_trace_s_token_counts_are_held_as_int32_only_where_they_fit() -> None:
    """A per-request array held for the whole trace halves as int32, its sums and means those of
    the int64 it came from; a value past int32 keeps the array int64."""
    rng = np.random.default_rng(7)
    wide = rng.integers(1, 2**31 - 1, 100_003, dtype=np.int64)
    small = narrow(wide)
    assert small.dtype == np.int32 and np.array_equal(small, wide)
    assert int(small.sum()) == int(wide.sum()) and float(small.mean()) == float(wide.mean())
    past = np.array([1, 2**31], dtype=np.int64)
    assert narrow(past) is past


def test_workload_requests_from_the_canonical_frame() -> None:
    import polars as pl

    frame = pl.DataFrame(
        {"prompt_tokens": [100, 1000, None], "output_tokens": [10, 20, 30], "hits": [0, 512, 0]}
    )
    by_share = workload_requests(frame, cached_share=0.5)
    assert by_share.prompt.tolist() == [100, 1000] and by_share.cached.tolist() == [50, 500]
    assert by_share.prompt.dtype == by_share.output.dtype == by_share.cached.dtype == np.int32
    by_column = workload_requests(frame, cached_column="hits")
    assert by_column.cached.tolist() == [0, 512]
    with pytest.raises(ValueError, match="cached_share"):
        workload_requests(frame, cached_share=1.0)
    with pytest.raises(ValueError, match="no requests"):
        WorkloadRequests(
            prompt=np.array([], dtype=np.int64),
            output=np.array([], dtype=np.int64),
            cached=np.array([], dtype=np.int64),
        )


def test_unreachable_slo_is_unknown_not_zero() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    slow = model.model_copy(
        update={"coefficients": StepCoefficients(**{**STEP, "prefill_s_per_token": 1e-3})}
    )
    c = carry_to_workload(
        "vllm",
        slow,
        workload("long"),
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=5.0,
        mean_rate_rps=2.0,
        config=default_config().capacity.replace(sample_requests=500),
    )
    assert isinstance(c.workload_capacity_rps, Unknown)
    assert "not met even at" in c.workload_capacity_rps.reason
    assert isinstance(c.cost, Unknown)


def test_the_searchs_verdict_is_run_stats_verdict() -> None:
    """The search counts rather than sorts the pooled gaps; every verdict is the one the full
    statistics give, on both sides of the capacity and for both ITL definitions."""
    model = fitted("short")
    assert isinstance(model, ServingModel)
    mix = workload("long", 0.3)
    drawn = sample_requests(mix.prompt, mix.output, mix.cached, CONFIG)
    verdicts = set()
    for definition in ("per-gap", "per-request"):
        slo = SLO.model_copy(update={"itl_definition": definition, "itl_p99_ms": 45.0})
        for rate in np.geomspace(2.0, 12.0, 14):
            run = simulate_at(
                model.coefficients, drawn, rate, limits=model.limits, kv_tokens=KV_TOKENS
            )
            full = run_stats(run, drawn.output, rate, CONFIG, slo.ttft_p95_ms).meets(slo)
            assert slo_met(run, drawn.output, slo, CONFIG) == full, (definition, rate)
            verdicts.add(full)
    assert verdicts == {True, False}


def _two(chunked: bool) -> tuple[float, float]:
    tokens = np.array([600, 600])
    run = simulate_replica(
        np.array([0.0, 0.0]),
        tokens,
        tokens,
        np.array([2, 2]),
        token_budget=1000,
        max_batch=8,
        kv_tokens=10_000,
        chunked_prefill=chunked,
        **STEP,
    )
    return float(run.ttft_s[0]), float(run.ttft_s[1])


def test_chunked_prefill_off_prefills_whole_prompts_one_behind_the_other() -> None:
    # Chunked: the first step takes r0's 600 tokens and 400 of r1's; r1's last 200 share the
    # next step with r0's first decode (context 600 + 1).
    first, second = _two(chunked=True)
    assert first == pytest.approx(0.005 + 1000 * 1e-5)
    assert second == pytest.approx(first + 0.005 + 200 * 1e-5 + 1e-4 + 601 * 1e-8)
    # Off: r1's whole prompt does not fit what r0 left, so it waits a step (head of line).
    first, second = _two(chunked=False)
    assert first == pytest.approx(0.005 + 600 * 1e-5)
    assert second == pytest.approx(first + 0.005 + 600 * 1e-5 + 1e-4 + 601 * 1e-8)


def test_the_replica_counts_what_held_requests_back() -> None:
    tokens = np.array([600, 600, 600])
    arrivals = np.zeros(3)
    by_kv = simulate_replica(
        arrivals,
        tokens,
        tokens,
        np.array([3, 3, 3]),
        token_budget=4096,
        max_batch=8,
        kv_tokens=1300,
        **STEP,
    )
    assert by_kv.kv_blocked_steps > 0 and by_kv.batch_blocked_steps == 0
    by_batch = simulate_replica(
        arrivals,
        tokens,
        tokens,
        np.array([3, 3, 3]),
        token_budget=4096,
        max_batch=1,
        kv_tokens=10_000,
        **STEP,
    )
    assert by_batch.batch_blocked_steps > 0 and by_batch.kv_blocked_steps == 0
    # Each request's two gaps ended in steps with no prompt tokens (one request at a time).
    assert by_batch.gaps_s.size == 6 and by_batch.gap_prefill_max == 0
    # Two 600-token prompts, a 1,000-token budget: r0's one gap ends in the step that
    # prefills r1's last 200 tokens.
    shared = simulate_replica(
        np.zeros(2),
        tokens[:2],
        tokens[:2],
        np.array([2, 2]),
        token_budget=1000,
        max_batch=8,
        kv_tokens=10_000,
        **STEP,
    )
    assert shared.gap_prefill_max == 200
    small_budget = simulate_replica(
        np.zeros(1),
        np.array([2500]),
        np.array([2500]),
        np.array([2]),
        token_budget=1000,
        max_batch=8,
        kv_tokens=10_000,
        **STEP,
    )
    assert small_budget.budget_full_steps == 2  # two of its three steps left prompt waiting
    assert small_budget.steps == 4


def _bound(kv_tokens: int = KV_TOKENS, **limits: int) -> str:
    model = fitted("short")
    assert isinstance(model, ServingModel)
    changed = model.limits.model_copy(
        update={
            name: getattr(model.limits, name).model_copy(update={"value": value})
            for name, value in limits.items()
        }
    )
    candidate = carry_to_workload(
        "vllm",
        model.model_copy(update={"limits": changed}),
        workload("short"),
        SLO,
        kv_tokens=kv_tokens,
        gpu_hour_usd=PRICE,
        peak_rate_rps=20.0,
        mean_rate_rps=10.0,
        config=CONFIG,
    )
    assert not isinstance(candidate.binding, Unknown), candidate.binding
    return candidate.binding.limit


def test_what_binds_is_the_limit_whose_relaxation_passes() -> None:
    # Short prompts at 256 running requests: the running-request limit holds them back (the
    # simulator's own search agrees: its capacity there is bounded by max_seqs 256).
    assert _bound() == "running_requests"
    # A KV pool of 20,000 tokens holds about 50 requests of 400 tokens.
    assert _bound(kv_tokens=20_000) == "kv_pool"
    # With room for every request, the steps' length is what remains: p99 ITL or queueing.
    assert _bound(max_batch=1024) in ("itl", "ttft_queueing")
