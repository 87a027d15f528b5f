"""Held-out checks: a serving model fitted on one request mix, asked about another, against the
independent simulator's own answer (its own capacity search at the same SLO).

Sweeps are real vLLM ``bench serve`` result files (per-request arrays, sidecar manifest) read
by the product's bench readers; see ``capacity_scenarios``.
"""

from __future__ import annotations

from functools import cache

import pytest

from pipeline.capacity.compute import carry_to_workload
from pipeline.capacity.result import Arrivals, CandidateCapacity, ServingModel, WorkloadCost
from pipeline.unknown import Unknown
from tests.capacity_scenarios import (
    CONFIG,
    KV_TOKENS,
    PRICE,
    SLO,
    bursty_truth,
    bursty_workload,
    fitted,
    truth,
    truth_costs,
    workload,
)

TOLERANCE = 0.20
#: The decode share's price compounds the capacity's error with the split of busy time.
SPLIT_TOLERANCE = 0.25


@cache
def carried(bench: str, work: str, cached_share: float = 0.0) -> CandidateCapacity:
    model = fitted(bench)
    assert isinstance(model, ServingModel), model
    return carry_to_workload(
        f"vllm@{bench}",
        model,
        workload(work, cached_share),
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=20.0,
        mean_rate_rps=10.0,
        config=CONFIG,
        benchmark_cost_per_1m_output_usd=0.1,
    )


def _capacity(c: CandidateCapacity) -> float:
    assert not isinstance(c.workload_capacity_rps, Unknown), c.workload_capacity_rps
    return c.workload_capacity_rps


def _cost(c: CandidateCapacity) -> WorkloadCost:
    assert isinstance(c.cost, WorkloadCost), c.cost
    return c.cost


@pytest.mark.parametrize(
    ("bench", "work", "cached_share"),
    [
        ("short", "long", 0.0),  # 200-token benchmark, 4,000-token workload, no sharing
        ("long", "short", 0.0),  # and the reverse
        ("short", "long", 0.6),  # 60 % of the workload's prompt tokens served from cache
    ],
    ids=["short-to-long", "long-to-short", "short-to-long-cached"],
)
def test_capacity_and_cost_match_the_simulator(bench: str, work: str, cached_share: float) -> None:
    candidate = carried(bench, work, cached_share)
    true_rate, _ = truth(work, cached_share)
    true_all_in, true_decode = truth_costs(work, cached_share)
    predicted = _capacity(candidate)
    cost = _cost(candidate)
    assert predicted == pytest.approx(true_rate, rel=TOLERANCE)
    assert cost.all_in_cost_per_1m_output_usd == pytest.approx(true_all_in, rel=TOLERANCE)
    assert cost.cost_per_1m_output_usd == pytest.approx(true_decode, rel=SPLIT_TOLERANCE)
    low, high = candidate.workload_capacity_band_rps  # type: ignore[misc]
    assert low <= predicted <= high
    # The band (residuals with the validation error) holds the simulator's truth.
    assert low <= true_rate <= high
    assert candidate.capacity_basis == "transferred"
    assert "simulated" in candidate.capacity_method


def test_far_transfer_is_provisional_and_says_how_far() -> None:
    candidate = carried("short", "long")
    transfer = candidate.transfer
    assert not isinstance(transfer, Unknown)
    assert transfer.prompt_ratio == pytest.approx(20.0, rel=0.05)
    assert transfer.far and transfer.outside_fitted_range
    assert candidate.provisional_reason and "far outside" in candidate.provisional_reason
    assert "19.9× longer" in transfer.description


def test_mixes_get_different_costs_in_the_right_direction() -> None:
    short = _cost(carried("short", "short"))
    long = _cost(carried("short", "long"))
    cached = _cost(carried("short", "long", 0.6))
    # Longer prompts: fewer requests a replica serves, so each output token carries more GPU time.
    assert long.all_in_cost_per_1m_output_usd > 3 * short.all_in_cost_per_1m_output_usd
    # A cached prefix is prefill not done: the same long prompts cost less.
    assert cached.all_in_cost_per_1m_output_usd < long.all_in_cost_per_1m_output_usd
    assert _capacity(carried("short", "long", 0.6)) > _capacity(carried("short", "long"))
    # Prefill's share of the GPU grows with the prompt; cached tokens are priced below input.
    assert long.prefill_share > short.prefill_share
    assert isinstance(cached.cost_per_1m_cached_input_usd, float)
    assert isinstance(cached.cost_per_1m_input_usd, float)
    assert cached.cost_per_1m_cached_input_usd < cached.cost_per_1m_input_usd
    assert isinstance(short.cost_per_1m_cached_input_usd, Unknown)  # nothing cached: not 0


def test_the_three_prices_add_up_to_the_replica_hour() -> None:
    candidate = carried("short", "long", 0.6)
    cost = _cost(candidate)
    rate = _capacity(candidate)
    mix = workload("long", 0.6)
    per_hour = rate * 3600.0 / 1e6
    assert isinstance(cost.cost_per_1m_input_usd, float)
    assert isinstance(cost.cost_per_1m_cached_input_usd, float)
    bill = per_hour * (
        cost.cost_per_1m_output_usd * mix.output_mean
        + cost.cost_per_1m_input_usd * (mix.prompt_mean - mix.cached_mean)
        + cost.cost_per_1m_cached_input_usd * mix.cached_mean
    )
    assert bill == pytest.approx(PRICE, rel=1e-9)


def test_benchmark_figure_kept_beside_the_workload_cost() -> None:
    candidate = carried("short", "long")
    assert candidate.benchmark_cost_per_1m_output_usd == 0.1


def test_a_model_that_gives_cached_context_no_time_prices_cached_tokens_as_unknown() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel), model
    free_context = model.model_copy(
        update={
            "coefficients": model.coefficients.model_copy(
                update={"context_s_per_token": 0.0, "attention_s_per_pair": 0.0}
            )
        }
    )
    candidate = carry_to_workload(
        "vllm@short",
        free_context,
        workload("long", 0.6),
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=20.0,
        mean_rate_rps=10.0,
        config=CONFIG,
    )
    cached = _cost(candidate).cost_per_1m_cached_input_usd
    assert isinstance(cached, Unknown), cached
    assert "no GPU time" in cached.reason


@pytest.mark.parametrize("cached_share", [0.0, 0.3, 0.6])
@pytest.mark.parametrize("cv", [1.0, 2.0])
def test_bursty_cached_matrix_within_20_percent_of_the_simulator(
    cv: float, cached_share: float
) -> None:
    """The 200-token benchmark carried to a 4,000-token workload arriving as its own trace
    (Gamma gaps of CV 1 or 2) with per-request cache hits averaging 0, 30 or 60 %: the
    capacity is within 20 % of the simulator's own, and bursts never raise it above the
    Poisson figure beside it."""
    model = fitted("short")
    assert isinstance(model, ServingModel), model
    trace = Arrivals(kind="trace", cv=cv, description="the workload's own arrivals")
    candidate = carry_to_workload(
        "vllm@short",
        model,
        bursty_workload("long", cv, cached_share),
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=20.0,
        mean_rate_rps=10.0,
        config=CONFIG.replace(sample_requests=4000),
        arrivals=trace,
    )
    predicted = _capacity(candidate)
    assert predicted == pytest.approx(bursty_truth("long", cv, cached_share), rel=TOLERANCE)
    poisson = candidate.variant("poisson")
    assert poisson is not None and isinstance(poisson.capacity_rps, float)
    if cv == 2.0:
        assert poisson.capacity_rps > 1.2 * predicted
