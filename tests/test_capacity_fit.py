"""The serving-model fit: known parameters recovered, errors on its own points, the prior when
the data cannot split prefill from decode, and Unknown (never 0) when nothing can."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import polars as pl
import pytest

from pipeline.bench.readers import read_bench_files
from pipeline.capacity.compute import carry_to_workload, unidentified_context
from pipeline.capacity.fit import CHUNKED_ITL_SHARE, deployment_of, fit_serving_model
from pipeline.capacity.present import model_errors_table
from pipeline.capacity.prior import gpu_peaks, roofline_prior
from pipeline.capacity.result import CandidateCapacity, ServingModel
from pipeline.capacity.search import RequestSample
from pipeline.config import default_config
from pipeline.unknown import Unknown
from tests import batching_server_sim as sim
from tests.capacity_scenarios import (
    CONFIG,
    KV_TOKENS,
    LLAMA_8B,
    PRICE,
    RATES,
    SLO,
    fitted,
    sweep,
    workload,
)

NOISE_FREE = sim.GpuServer(jitter_sigma=0.0, attention_ms=0.0)
# Three request mixes, so the context cost has data of its own (prompts 200, 1,300, 4,000).
THREE_MIXES = {
    "short": ((100, 300), (100, 300), (10.0, 25.0, 40.0)),
    "mid": ((1000, 1600), (100, 300), (3.0, 8.0, 14.0)),
    "long": ((3000, 5000), (100, 300), (0.5, 1.5, 3.0)),
}


def _carried(model: ServingModel, mix: str) -> CandidateCapacity:
    """``model`` carried to a workload of ``mix`` at 5 req/s peak, 2 mean."""
    return carry_to_workload(
        "vllm",
        model,
        workload(mix),
        SLO,
        kv_tokens=KV_TOKENS,
        gpu_hour_usd=PRICE,
        peak_rate_rps=5.0,
        mean_rate_rps=2.0,
        config=CONFIG,
    )


@lru_cache(maxsize=1)
def noise_free_model() -> ServingModel | Unknown:
    from tests.capacity_scenarios import _ROOT

    root = _ROOT / "noise-free"
    for i, (name, (prompts, outputs, rates)) in enumerate(THREE_MIXES.items()):
        p, o = sim.mix(400, prompts, outputs, seed=20 + i)
        sim.write_sweep(NOISE_FREE, root / name, list(rates), p, o, seed=30 + 5 * i)
    read = read_bench_files(root)
    points = read.load_points
    # No model shape: no prior, so every coefficient comes from the data.
    return fit_serving_model(
        points, read.per_request, deployment_of(points.row(0, named=True)), config=CONFIG
    )


def test_fit_recovers_known_parameters_on_noise_free_data() -> None:
    model = noise_free_model()
    assert isinstance(model, ServingModel), model
    assert model.prefill_split_basis == "fitted"
    assert model.context_basis == "fitted"
    assert model.attention_basis == "assumed_zero"  # and the simulator has none here
    c = model.coefficients
    assert c.overhead_s * 1e3 == pytest.approx(NOISE_FREE.fixed_ms, rel=0.05)
    assert c.prefill_s_per_token * 1e3 == pytest.approx(NOISE_FREE.linear_ms, rel=0.10)
    # Decode per request and per context token trade off along the mixes' contexts (the
    # server allocates KV block by block and schedules as vLLM does, the model does not), so
    # each is recovered more loosely than their sum over a step.
    assert c.decode_s_per_request * 1e3 == pytest.approx(NOISE_FREE.per_sequence_ms, rel=0.25)
    assert c.context_s_per_token * 1e3 == pytest.approx(NOISE_FREE.kv_read_ms, rel=0.25)
    assert model.residual_spread < 0.05


def test_errors_on_fitted_points_are_reported_and_small() -> None:
    model = fitted("short")
    assert isinstance(model, ServingModel), model
    assert model.points_used == len(RATES["short"]) == len(model.point_errors)
    for point in model.point_errors:
        assert point.replayed  # vLLM start times: the point's own requests were replayed
        assert set(point.error) == {
            "ttft_p50",
            "ttft_p95",
            "itl_p50",
            "itl_p99",
            "tpot_p50",
            "tpot_p99",
        }
        for stat in ("ttft_p50", "ttft_p95", "itl_p50", "tpot_p50", "tpot_p99"):
            error = point.error[stat]
            assert isinstance(error, float), (stat, error)
            assert abs(error) < 0.15, (point.point_id, stat, error)
    assert model.prefill_split_basis == "fitted"
    assert model.context_basis == "prior"  # one mix: the prior splits requests from context


def test_capacity_check_against_the_measured_bracket() -> None:
    read = sweep("long")
    points = read.load_points
    # Pretend the sweep went one step further and failed there.
    model = fit_serving_model(
        points,
        read.per_request,
        deployment_of(points.row(0, named=True)),
        config=CONFIG,
        model_shape=LLAMA_8B,
        measured_capacity=(3.5, 4.4),
        slo=SLO,
    )
    assert isinstance(model, ServingModel)
    check = model.capacity_check
    assert check is not None and isinstance(check.predicted_rps, float)
    assert check.within_bracket  # the simulator's own capacity at this mix is about 3.9


def test_sweep_without_per_request_data_uses_the_prior_and_says_so() -> None:
    model = fitted("short", per_request=False)
    assert isinstance(model, ServingModel), model
    assert model.prefill_split_basis == "prior"
    assert any("roofline prior" in note for note in model.notes)
    assert not any(p.replayed for p in model.point_errors)
    assert isinstance(model.point_errors[0].measured["ttft_p95"], Unknown)  # vLLM wrote p99 only
    candidate = _carried(model, "long")
    assert candidate.provisional_reason and "roofline prior" in candidate.provisional_reason


def test_unknown_gpu_gives_unknown_not_zero() -> None:
    assert isinstance(gpu_peaks("TPU v5e"), Unknown)
    assert isinstance(roofline_prior("Gaudi3", 1, LLAMA_8B), Unknown)
    model = fitted("short", per_request=False, gpu_type="Gaudi3")
    assert isinstance(model, Unknown)
    assert "Gaudi3" in model.reason
    candidate = _carried(model, "long")
    assert isinstance(candidate.workload_capacity_rps, Unknown)
    assert isinstance(candidate.cost, Unknown)
    assert isinstance(candidate.workload_capacity_band_rps, Unknown)


def test_unknown_gpu_with_per_request_data_still_fits_but_context_is_assumed() -> None:
    model = fitted("short", per_request=True, gpu_type="Gaudi3")
    assert isinstance(model, ServingModel), model
    assert model.prefill_split_basis == "fitted"
    assert model.context_basis == "assumed_zero"
    assert isinstance(model.prior, Unknown)


def test_one_mix_without_a_prior_carries_no_capacity_to_another_context() -> None:
    """One mix and no prior cannot price reading a longer context: the 4,000-token workload
    gets the reason and the remedy, no number; a workload of the benchmark's own lengths still
    gets its capacity."""
    model = fitted("short", per_request=True, gpu_type="Gaudi3")
    assert isinstance(model, ServingModel) and model.self_check.passed, model

    far = _carried(model, "long").workload_capacity_rps
    assert isinstance(far, Unknown)
    assert far.reason.startswith("the workload's decodes read contexts ")
    assert "longer than the benchmark's" in far.reason
    assert "no roofline prior (GPU 'Gaudi3' is not in the roofline table)" in far.reason
    assert far.reason.endswith(
        "no capacity is carried to this workload (a benchmark at two prompt lengths 1.5× apart "
        "tells them apart); benchmark this deployment on your own traffic (enginefit loadtest)"
    )
    assert isinstance(_carried(model, "short").workload_capacity_rps, float)


def test_the_context_a_workload_reads_is_weighted_by_its_decodes() -> None:
    """Two requests, prompts 100 and 300, answers 11 and 21 tokens: 10 and 20 decodes reading
    100 + 5.5 and 300 + 10.5 tokens, (10 × 105.5 + 20 × 310.5) ÷ 30 = 242.2 tokens on average;
    against a benchmark of 60-token prompts and 20-token answers (70 tokens) that is 3.46×."""
    model = fitted("short", per_request=True, gpu_type="Gaudi3")
    assert isinstance(model, ServingModel), model
    sample = RequestSample(
        prompt=np.array([100, 300]),
        uncached=np.array([100, 300]),
        output=np.array([11, 21]),
        unit_arrivals=np.array([0.0, 1.0]),
    )
    bench = {"bench_prompt_tokens_mean": 60.0, "bench_output_tokens_mean": 20.0}
    reason = unidentified_context(model.model_copy(update=bench), sample)
    assert reason is not None
    assert "contexts 3.46× longer than the benchmark's (242 against 70 tokens)" in reason
    # Within 1.5× of a 210-token benchmark (242 ÷ 210 = 1.15), or with a prior: priced.
    near = {"bench_prompt_tokens_mean": 200.0, "bench_output_tokens_mean": 20.0}
    assert unidentified_context(model.model_copy(update=near), sample) is None
    prior = {**bench, "context_basis": "prior"}
    assert unidentified_context(model.model_copy(update=prior), sample) is None


def test_table_of_gpus_known() -> None:
    for name in ("H100-80GB", "NVIDIA H200", "A100-80GB", "L40S", "L4", "MI300X", "B200"):
        peaks = gpu_peaks(name)
        assert not isinstance(peaks, Unknown), name
        assert peaks.source_url.startswith("https://")
    h100_pcie, l4 = gpu_peaks("H100 PCIe"), gpu_peaks("NVIDIA L4")
    assert not isinstance(h100_pcie, Unknown) and h100_pcie.name == "H100 PCIe"
    assert not isinstance(l4, Unknown) and l4.name == "L4"


def test_no_usable_point_is_unknown() -> None:
    read = sweep("short")
    closed = read.load_points.head(1).with_columns(offered_rate_rps=None, achieved_rate_rps=None)
    model = fit_serving_model(
        closed,
        None,
        deployment_of(closed.row(0, named=True)),
        config=default_config().capacity,
        model_shape=LLAMA_8B,
    )
    assert isinstance(model, Unknown)
    assert "no finite send rate" in model.reason


def test_latency_outside_the_gpu_is_fitted_as_request_latency() -> None:
    from tests.capacity_scenarios import _ROOT

    server = sim.GpuServer(api_latency_ms=40.0)
    prompt, output = sim.mix(400, (100, 300), (100, 300), seed=8)
    sim.write_sweep(server, _ROOT / "api-latency", [5.0, 25.0, 45.0], prompt, output)
    read = read_bench_files(_ROOT / "api-latency")
    points = read.load_points
    model = fit_serving_model(
        points,
        read.per_request,
        deployment_of(points.row(0, named=True)),
        config=CONFIG,
        model_shape=LLAMA_8B,
    )
    assert isinstance(model, ServingModel), model
    assert model.coefficients.request_latency_s * 1e3 == pytest.approx(40.0, rel=0.2)
    for point in model.point_errors:
        error = point.error["ttft_p50"]
        assert isinstance(error, float) and abs(error) < 0.1
    assert fitted("short").coefficients.request_latency_s < 0.002  # type: ignore[union-attr]


def test_a_chunked_stream_itl_median_is_not_compared_and_the_table_says_so() -> None:
    """A tool that times gaps between multi-token chunks reports an ITL p50 near zero; the fit's
    error against it would read +8,000 %. Below a quarter of the TPOT p50 it is not compared."""
    read = sweep("short")
    points = read.load_points.with_columns(
        (pl.col("tpot_p50_ms") * CHUNKED_ITL_SHARE * 0.9).alias("itl_p50_ms")
    )
    model = fit_serving_model(
        points, read.per_request, deployment_of(points.row(0, named=True)), config=CONFIG
    )
    assert isinstance(model, ServingModel), model
    for point in model.point_errors:
        error = point.error["itl_p50"]
        assert isinstance(error, Unknown) and error.reason.startswith("not comparable"), error
        assert isinstance(point.error["tpot_p50"], float)  # the rest is still compared
    assert "| not comparable |" in model_errors_table(model)
    # Just above the threshold the median is a decode step and is compared.
    at_threshold = read.load_points.with_columns(
        (pl.col("tpot_p50_ms") * CHUNKED_ITL_SHARE * 1.1).alias("itl_p50_ms")
    )
    compared = fit_serving_model(
        at_threshold, read.per_request, deployment_of(points.row(0, named=True)), config=CONFIG
    )
    assert isinstance(compared, ServingModel)
    assert all(isinstance(p.error["itl_p50"], float) for p in compared.point_errors)


def test_a_sweep_the_model_cannot_reproduce_has_no_transferred_capacity() -> None:
    """The heaviest point's measured p99 ITL doubled (a tail no step model of this server
    produces): the self-check names that point and statistic, and the workload gets no
    capacity, only the reason and what to do."""
    read = sweep("short")
    heaviest = read.load_points.get_column("offered_rate_rps").max()
    points = read.load_points.with_columns(
        pl.when(pl.col("offered_rate_rps") == heaviest)
        .then(pl.col("itl_p99_ms") * 2)
        .otherwise(pl.col("itl_p99_ms"))
        .alias("itl_p99_ms")
    )
    # Without per-request rows the file's p99 ITL is the one compared.
    model = fit_serving_model(
        points,
        None,
        deployment_of(points.row(0, named=True)),
        config=CONFIG,
        model_shape=LLAMA_8B,
    )
    assert isinstance(model, ServingModel), model
    check = model.self_check
    assert not check.passed and check.points_checked == len(RATES["short"])
    assert check.reason is not None
    assert check.reason.startswith(
        "the serving model does not reproduce its own benchmark: p99 ITL"
    )
    assert "(45" in check.reason and "beyond ±25%" in check.reason
    assert check.worst_error is not None and check.worst_error < -0.25
    candidate = _carried(model, "long")
    capacity = candidate.workload_capacity_rps
    assert isinstance(capacity, Unknown)
    assert capacity.reason.startswith(check.reason)
    assert capacity.reason.endswith(
        "no capacity is carried to this workload; benchmark this deployment on your own "
        "traffic (enginefit loadtest)"
    )
    assert isinstance(candidate.cost, Unknown) and isinstance(candidate.binding, Unknown)
    # The same sweep as measured: the model reproduces it.
    assert fitted("short").self_check.passed  # type: ignore[union-attr]


def test_a_coefficient_below_its_physical_floor_is_raised_to_it_and_said() -> None:
    """A server faster than an H100 can be (half the floor's step) fitted with the H100's
    floors: the overhead is set to reading 8.03 B BF16 weights at 3.35 TB/s and listed."""
    from tests.capacity_scenarios import _ROOT

    fast = sim.GpuServer(fixed_ms=2.0)
    prompt, output = sim.mix(300, (100, 300), (100, 300), seed=8)
    sim.write_sweep(fast, _ROOT / "too-fast", [5.0, 25.0], prompt, output)
    read = read_bench_files(_ROOT / "too-fast")
    points = read.load_points
    model = fit_serving_model(
        points,
        read.per_request,
        deployment_of(points.row(0, named=True)),
        config=CONFIG,
        model_shape=LLAMA_8B,
    )
    assert isinstance(model, ServingModel), model
    floor = 8.03e9 * 2 / 3.35e12
    assert model.coefficients.overhead_s == pytest.approx(floor)
    assert any(f.startswith("overhead_s: fitted ") and f"{floor:.4g} s" in f for f in model.floored)
