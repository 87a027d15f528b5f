"""The capacity search's arrivals: the traffic's own pattern in contiguous runs, Gamma gaps at a
measured CV, the Poisson twin beside them, and what burstiness does to a replica's capacity in
the product's simulation and in the independent simulator."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from pipeline.capacity.kernels import F64
from pipeline.capacity.result import Arrivals
from pipeline.capacity.search import (
    CONTEXT_RUNS,
    POISSON,
    RequestSample,
    poisson_twin,
    run_stats,
    sample_requests,
    search_capacity,
    simulate_at,
    trace_windows,
)
from pipeline.capacity.stage import arrival_pattern
from pipeline.shape.result import Arrivals as ShapeArrivals
from pipeline.shape.result import WindowCounts
from pipeline.unknown import Unknown
from tests import batching_server_sim as sim
from tests.capacity_scenarios import CONFIG, KV_TOKENS, MIXES, SLO, bursty_truth, fitted


def _gamma(cv: float) -> Arrivals:
    return Arrivals(kind="gamma", cv=cv, description=f"Gamma CV {cv}")


TRACE = Arrivals(kind="trace", cv=2.0, description="the trace's own")


def test_trace_runs_are_contiguous_stratified_and_scaled_to_their_surroundings() -> None:
    # A trace at 1 req/s whose middle third runs at 4 req/s, with one burst of 20 requests
    # 1 ms apart at request 5,000.
    gaps = np.ones(9000)
    gaps[3000:6000] = 0.25
    gaps[5000:5020] = 0.001
    arrival: F64 = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))
    index, unit = trace_windows(arrival, 800, 8, np.random.default_rng(0))
    runs = np.split(index, np.flatnonzero(np.diff(index) != 1) + 1)
    # Eight runs of 100 consecutive requests, one in each eighth of the trace, none overlapping.
    assert [r.size for r in runs] == [100] * 8
    assert [int(r[0] * 8 // 9000) for r in runs] == list(range(8))
    assert bool(np.all(np.diff(index) > 0))
    # A run of the fast stretch is scaled by the fast stretch's mean gap, not the trace's: its
    # unit gaps are 1, as the slow stretches' are; one unit gap precedes each run.
    unit_gaps = np.diff(np.concatenate(([0.0], unit)))
    reach = 100 * (CONTEXT_RUNS - 1) // 2
    checked = 0
    for run, start in zip(runs, np.cumsum([0] + [r.size for r in runs[:-1]]), strict=True):
        assert unit_gaps[start] == 1.0
        lo, hi = run[0] - reach, run[-1] + reach
        one_stretch = hi < 3000 or (lo >= 3000 and hi < 6000) or lo >= 6000
        if one_stretch and not (lo <= 5020 and hi >= 5000):
            inner = unit_gaps[start + 1 : start + run.size]
            assert inner == pytest.approx(np.ones(inner.size), rel=0.01)
            checked += 1
    assert checked >= 4
    # A trace no larger than the sample is replayed whole, in order, at its own mean gap (3 s).
    small = np.array([0.0, 2.0, 4.0, 4.0, 12.0])
    index, unit = trace_windows(small, 10, 8, np.random.default_rng(0))
    assert index.tolist() == [0, 1, 2, 3, 4]
    assert unit == pytest.approx([1.0, 1 + 2 / 3, 1 + 4 / 3, 1 + 4 / 3, 1 + 12 / 3])


def test_a_burst_keeps_its_shape_inside_a_run() -> None:
    """The run holding the burst replays it 1 ms apart (÷ the context's mean gap), while a
    random draw of requests would scatter it."""
    gaps = np.ones(20_000)
    gaps[10_000:10_050] = 0.001
    arrival = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))
    index, unit = trace_windows(arrival, 20_000 - 1, 1, np.random.default_rng(0))
    burst = np.flatnonzero((index > 10_000) & (index < 10_050))
    assert burst.size == 49
    mean_gap = (arrival[-1] - arrival[0]) / (arrival.size - 1)  # the context: all of it
    assert np.diff(unit[burst]) == pytest.approx(np.full(48, 0.001 / mean_gap))


def _lengths(n: int = 20_000, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    return sim.mix(n, *MIXES["short"], seed=seed)


def test_gamma_gaps_have_the_cv_asked_and_cv_1_is_the_poisson_sample() -> None:
    prompt, output = _lengths()
    cached = np.zeros_like(prompt)
    config = CONFIG.replace(sample_requests=20_000)
    for cv in (0.5, 2.0, 3.0):
        drawn = sample_requests(prompt, output, cached, config, _gamma(cv))
        gaps = np.diff(np.concatenate(([0.0], drawn.unit_arrivals)))
        assert float(gaps.mean()) == pytest.approx(1.0, rel=0.05)
        assert float(gaps.std() / gaps.mean()) == pytest.approx(cv, rel=0.1)
    poisson = sample_requests(prompt, output, cached, CONFIG)
    one = sample_requests(prompt, output, cached, CONFIG, _gamma(1.0))
    assert np.array_equal(one.unit_arrivals, poisson.unit_arrivals)
    assert np.array_equal(one.index, poisson.index)  # type: ignore[arg-type]
    # The Poisson twin of a bursty sample: its requests, the Poisson sample's gaps.
    bursty = sample_requests(prompt, output, cached, CONFIG, _gamma(2.0))
    twin = poisson_twin(bursty)
    assert np.array_equal(twin.index, bursty.index)  # type: ignore[arg-type]
    assert np.array_equal(twin.unit_arrivals, poisson.unit_arrivals)
    assert np.array_equal(poisson_twin(poisson).unit_arrivals, poisson.unit_arrivals)


def test_trace_arrivals_need_the_times_and_keep_each_request_with_its_own_cached_tokens() -> None:
    prompt, output = _lengths()
    cached = prompt // 3
    with pytest.raises(ValueError, match="one arrival time per workload request"):
        sample_requests(prompt, output, cached, CONFIG, TRACE)
    arrival = np.cumsum(np.random.default_rng(1).gamma(0.25, 4.0, prompt.size))
    drawn = sample_requests(prompt, output, cached, CONFIG, TRACE, arrival)
    assert drawn.index is not None and drawn.size == CONFIG.sample_requests
    assert np.array_equal(drawn.prompt, prompt[drawn.index])
    assert np.array_equal(drawn.cached, cached[drawn.index])
    other = drawn.with_workload_cached(prompt // 2)
    assert np.array_equal(other.cached, (prompt // 2)[drawn.index])
    assert np.array_equal(other.unit_arrivals, drawn.unit_arrivals)


def _meets(sample: RequestSample, rate: float) -> bool:
    model = fitted("short")
    assert not isinstance(model, Unknown)
    run = simulate_at(model.coefficients, sample, rate, limits=model.limits, kv_tokens=KV_TOKENS)
    stats = run_stats(run, sample.output, rate, CONFIG, SLO.ttft_p95_ms)
    return stats.meets(SLO)


def test_common_random_numbers_keep_pass_fail_monotone_in_the_rate() -> None:
    """Every rate replays the same requests at the same relative times, so bursty arrivals
    pass below one rate and fail above it: bisection has one edge to find."""
    prompt, output = _lengths()
    arrival = np.cumsum(np.random.default_rng(2).gamma(0.25, 4.0, prompt.size))
    drawn = sample_requests(prompt, output, np.zeros_like(prompt), CONFIG, TRACE, arrival)
    verdicts = [_meets(drawn, rate) for rate in np.geomspace(10.0, 80.0, 16)]
    assert verdicts[0] and not verdicts[-1]
    assert verdicts == sorted(verdicts, reverse=True)


@cache
def _cut_in_the_product(mix: str) -> tuple[float, float, float]:
    """(Poisson, Gamma CV 1, Gamma CV 2) capacity of the product's replica simulation, with
    the simulator's own step costs."""
    model = fitted("short")
    assert not isinstance(model, Unknown)
    prompt, output = sim.mix(20_000, *MIXES[mix], seed=5)
    config = CONFIG.replace(sample_requests=4000)
    figures = []
    for arrivals in (POISSON, _gamma(1.0), _gamma(2.0)):
        drawn = sample_requests(prompt, output, np.zeros_like(prompt), config, arrivals)
        found = search_capacity(
            model.coefficients, drawn, SLO, limits=model.limits, kv_tokens=KV_TOKENS, config=config
        )
        assert not isinstance(found, Unknown), found
        figures.append(found.rate_rps)
    return figures[0], figures[1], figures[2]


def _cut_in_the_reference(mix: str) -> tuple[float, float]:
    """(Poisson, Gamma CV 2) capacity of the independent simulator, its own search (8,000
    requests, seeds 7 and 8, nothing cached: the bursty truths of the transfer tests, shared
    with them)."""
    return bursty_truth(mix, 1.0, 0.0), bursty_truth(mix, 2.0, 0.0)


@pytest.mark.parametrize("mix", ["short", "long"])
def test_gamma_cv_2_cuts_capacity_in_the_product_as_in_the_reference(mix: str) -> None:
    poisson, one, two = _cut_in_the_product(mix)
    assert one == poisson  # CV 1 is the Poisson figure, to the last digit
    reference_poisson, reference_two = _cut_in_the_reference(mix)
    # The fit's own error at CV 1 (+5 % on 4,000-token prompts) grows under bursts, which
    # queue prefills for seconds: +21 % measured there (the cut itself is compared below).
    assert two == pytest.approx(reference_two, rel=0.25)
    if mix == "long":
        # 4,000-token prompts: a burst's prefills queue for seconds, so bursts cut the capacity
        # at the TTFT limit by more than half, in both simulations alike.
        cut, reference_cut = 1 - two / poisson, 1 - reference_two / reference_poisson
        assert cut > 0.4 and reference_cut > 0.4
        assert cut == pytest.approx(reference_cut, abs=0.08)
    else:
        # 200-token prompts fill the 256-request batch first: the limit is the throughput
        # wall (about 52 req/s), where bursts matter little, in both.
        assert two == pytest.approx(poisson, rel=0.15)
        assert reference_two == pytest.approx(reference_poisson, rel=0.15)


def _shape_arrivals(
    gap_cv: float | None, counts: dict[str, float | None], reason: str = "quantised"
) -> ShapeArrivals:
    windows: dict[str, WindowCounts | Unknown] = {
        label: WindowCounts(
            window_s=int(label.rstrip("s")),
            bins=100,
            mean_count=10.0,
            variance=10.0 * (idc or 1.0),
            index_of_dispersion=idc,
            peak_count=30,
            peak_rate_rps=3.0,
            peak_window_start="2025-01-01T00:00:00+00:00",
        )
        for label, idc in counts.items()
    }
    return ShapeArrivals.model_construct(
        windows=windows,
        inter_arrival=Unknown(reason=reason) if gap_cv is None else {"cv": gap_cv},
    )


def test_the_arrival_pattern_follows_what_the_shape_stage_measured() -> None:
    settings = CONFIG.replace(sample_requests=4000, arrival_windows=8)
    resolved = arrival_pattern(_shape_arrivals(1.8, {"60s": 5.0}), settings, 100_000)
    assert resolved.kind == "trace" and resolved.cv == 1.8
    assert "8 contiguous runs of about 500 requests" in resolved.description
    small = arrival_pattern(_shape_arrivals(1.8, {}), settings, 3000)
    assert "the whole trace in order" in small.description
    # Gaps not resolved: Gamma at the CV the smallest counted window implies.
    counted = arrival_pattern(_shape_arrivals(None, {"10s": 4.0, "60s": 9.0}), settings, 9000)
    assert counted.kind == "gamma" and counted.cv == pytest.approx(2.0)
    assert "10 s window counts' index of dispersion 4.00 (quantised)" in counted.description
    nothing = arrival_pattern(_shape_arrivals(None, {"1s": None}), settings, 9000)
    assert nothing.kind == "poisson" and "not known (quantised" in nothing.description
    # Configured: Poisson, Gamma at a given CV, Gamma at the measured one.
    assert arrival_pattern(_shape_arrivals(1.8, {}), settings.replace(arrivals="poisson"), 9) == (
        POISSON
    )
    fixed = arrival_pattern(
        _shape_arrivals(1.8, {}), settings.replace(arrivals="gamma", arrival_cv=3.0), 9
    )
    assert fixed.kind == "gamma" and fixed.cv == 3.0 and "configured" in fixed.description
    measured = arrival_pattern(_shape_arrivals(1.8, {}), settings.replace(arrivals="gamma"), 9)
    assert measured.kind == "gamma" and measured.cv == 1.8
