"""Predicted against measured: where a deployment was load-tested on the workload's own traffic
and benchmarked at another mix, the capacity stage fits the serving model without the
own-traffic sweep, predicts the workload's capacity from it, and sets it against the capacity
the bench stage measured on the own-traffic sweep (signed error = predicted ÷ measured − 1).

The sweeps are the independent simulator's (tests/batching_server_sim.py) written as vLLM
result files: a short-prompt sweep (prompts 100-300 tokens, tests/capacity_scenarios.py) and
one replaying the workload's own requests (prompts 300-700 tokens) with the manifest
``enginefit loadtest`` writes (``dataset: enginefit-trace``, ``workload: <name>``). The expected
error is computed apart from the stage: the prediction is the stage's own figure for the
workload when it is given the short sweep alone (what the product reported before the load
test), the measurement the highest rate of the own-traffic sweep whose simulated run met the
SLO, judged from the run itself.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from perf.capacity import LLAMA_8B
from pipeline.bench import stage as bench_stage
from pipeline.capacity import stage
from pipeline.capacity.compute import prediction_check, workload_requests
from pipeline.capacity.config import ServedModel
from pipeline.capacity.present import prediction_sentence, render_text
from pipeline.capacity.result import CandidateCapacity, CapacityResult, PredictionCheck
from pipeline.config import default_config
from pipeline.costing import Prices
from pipeline.schema import conform
from pipeline.shape.compute import compute_shape
from pipeline.unknown import Unknown
from tests import batching_server_sim as sim
from tests.capacity_scenarios import (
    BENCH_REQUESTS,
    CONFIG,
    KV_TOKENS,
    MIXES,
    RATES,
    SERVER,
    SLO,
)

WORKLOAD = "chat-own"
OWN_MIX = ((300, 700), (100, 300))
#: The own-traffic sweep's rates: the simulator's capacity for this mix is about 32 req/s
#: (its own search), so 10-30 pass well inside the SLO and 40-50 fail well outside it.
OWN_RATES = [10.0, 20.0, 30.0, 40.0, 50.0]
MODEL_ID = "meta-llama/Llama-3.1-8B-Instruct"
BENCH = default_config().bench
_ROOT: list[Path] = []


def _root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _ROOT:
        _ROOT.append(tmp_path_factory.mktemp("prediction-check"))
    return _ROOT[0]


def own_requests(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return sim.mix(n, *OWN_MIX, seed=seed)


def write_short(folder: Path, engine: str = "vllm", seed: int = 11) -> Path:
    """The short-prompt sweep (another mix than the workload's); another ``seed`` for another
    engine (byte-identical result files would be one run, read once)."""
    prompt, output = sim.mix(BENCH_REQUESTS, *MIXES["short"], seed=8)
    sim.write_sweep(SERVER, folder, RATES["short"], prompt, output, engine=engine, seed=seed)
    return folder


@cache
def own_runs() -> list[sim.ServedRun]:
    prompt, output = own_requests(BENCH_REQUESTS, seed=21)
    return [
        sim.simulate(SERVER, rate, prompt, output, seed=31 + k) for k, rate in enumerate(OWN_RATES)
    ]


def write_own(folder: Path) -> Path:
    """The sweep of the workload's own requests, as ``enginefit loadtest`` labels it."""
    folder.mkdir(parents=True, exist_ok=True)
    for run in own_runs():
        sim.write_vllm_result(run, folder / f"vllm-{run.rate:g}qps-own.json", MODEL_ID)
    manifest = {
        "engine": "vllm",
        "engine_version": "0.11.0",
        "gpu_type": "H100-80GB",
        "gpu_count": 1,
        "quantization": "bf16",
        "price_per_gpu_hour_usd": 2.5,
        "model": MODEL_ID,
        "workload": WORKLOAD,
        "dataset": "enginefit-trace",
    }
    (folder / "enginefit-bench.yaml").write_text(json.dumps(manifest))
    return folder


def workload_trace() -> pl.DataFrame:
    """The workload: 4,000 requests of the own mix, Poisson arrivals at 10 req/s."""
    prompt, output = own_requests(4000, seed=5)
    gaps = np.random.default_rng(4).exponential(0.1, prompt.shape[0])
    t0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    arrivals = [t0 + dt.timedelta(seconds=float(s)) for s in np.cumsum(gaps)]
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(prompt.shape[0])],
                "arrival": arrivals,
                "prompt_tokens": prompt,
                "output_tokens": output,
            }
        )
    )


def capacity_of(folders: list[Path]) -> CapacityResult:
    """The capacity stage on these benchmark folders for the workload, as the configured stages
    give it its inputs (the bench stage's analysis, the shape stage's arrivals)."""
    results = bench_stage.read_results(BENCH, folders)
    analysis = bench_stage.run(bench_stage.BenchInputs(results, None, "none", None), BENCH)
    trace = workload_trace()
    inputs = stage.CapacityInputs(
        workload=WORKLOAD,
        points=analysis.evaluated,
        per_request=results.per_request,
        bench_capacity=analysis.capacity,
        requests=workload_requests(trace),
        table_rows=trace.height,
        peak_rate_rps=40.0,
        mean_rate_rps=10.0,
        kv_tokens=KV_TOKENS,
        measured_arrivals=compute_shape(trace, default_config().shape).metrics.arrivals,
        cache=Unknown(reason="the workload's prompts share nothing here"),
        served=ServedModel(models=(MODEL_ID,), kv_tokens=KV_TOKENS, shape=LLAMA_8B),
        model_shape=LLAMA_8B,
        team_models=(MODEL_ID,),
        prices=Prices(default=2.5),
        slo=stage.capacity_slo(BENCH.slo),
        min_achieved_rate_share=BENCH.slo.min_achieved_rate_share,
        catalog=default_config().catalog(),
    )
    return stage.run(inputs, CONFIG)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = _root(tmp_path_factory)
    return {
        "short": write_short(root / "short-vllm"),
        "own": write_own(root / "own-vllm"),
        "short-sglang": write_short(root / "short-sglang", engine="sglang", seed=51),
    }


@pytest.fixture(scope="module")
def both(folders: dict[str, Path]) -> CapacityResult:
    """vLLM benchmarked at the short mix and on the workload's own traffic; SGLang at the short
    mix only."""
    return capacity_of([folders["short"], folders["own"], folders["short-sglang"]])


@pytest.fixture(scope="module")
def short_only(folders: dict[str, Path]) -> CapacityResult:
    """What the stage said before the load test: vLLM's short-mix sweep alone."""
    return capacity_of([folders["short"]])


def _candidate(result: CapacityResult, engine: str) -> CandidateCapacity:
    (found,) = [c for c in result.candidates if c.deployment.engine == engine]
    return found


def measured_independently() -> float:
    """The highest rate of the own-traffic sweep whose run met the SLO (p95 TTFT and p99
    per-gap ITL over every request, from the simulator's own records) before the first that
    did not; each verdict is far from the SLO's edge, so no judge of it could differ."""
    verdicts = []
    for run in own_runs():
        ttft = float(np.percentile(run.ttft, 95)) * 1000.0
        itl = float(np.percentile(run.itl_flat, 99)) * 1000.0
        ok = ttft <= SLO.ttft_p95_ms and itl <= SLO.itl_p99_ms
        # Far inside or far outside: a pass at half the TTFT limit, a failure at 1.5× it.
        assert ttft < 0.5 * SLO.ttft_p95_ms if ok else ttft > 1.5 * SLO.ttft_p95_ms, (
            run.rate,
            ttft,
        )
        verdicts.append((run.rate, ok))
    passing = [rate for rate, ok in verdicts if ok]
    assert [ok for _, ok in verdicts] == [True] * len(passing) + [False] * (
        len(verdicts) - len(passing)
    )
    return max(passing)


def test_the_error_is_the_short_fits_prediction_against_the_own_traffic_measurement(
    both: CapacityResult, short_only: CapacityResult, folders: dict[str, Path]
) -> None:
    check = _candidate(both, "vllm").prediction_check
    assert isinstance(check, PredictionCheck), check
    predicted = _candidate(short_only, "vllm").workload_capacity_rps
    assert isinstance(predicted, float)
    measured = measured_independently()
    assert measured == 30.0
    assert check.predicted_rps == predicted
    assert check.measured_rps == measured
    assert check.error == pytest.approx(predicted / measured - 1.0, rel=1e-12)
    # The prediction is a real one: within 20 % of the simulator's own capacity for this mix.
    truth, _ = sim.find_capacity(
        SERVER, *own_requests(2000, seed=99), None, SLO.ttft_p95_ms, SLO.itl_p99_ms, start=5.0
    )
    assert predicted == pytest.approx(truth, rel=0.2)
    assert check.measured_from.endswith(f"/ {WORKLOAD}") and "vllm" in check.measured_from
    assert len(check.fitted_from) == 1 and check.fitted_from[0].endswith("/ synthetic")
    # The candidate itself is measured on this workload (its model fitted on both sweeps).
    assert _candidate(both, "vllm").capacity_basis == "measured"


def test_a_deployment_not_load_tested_on_this_traffic_says_so(both: CapacityResult) -> None:
    check = _candidate(both, "sglang").prediction_check
    assert check == Unknown(
        reason="this workload's own traffic was not benchmarked on this deployment "
        "(enginefit loadtest replays it): nothing to check its capacity against"
    )
    text = render_text(both)
    assert "predicted against measured: unknown — this workload's own traffic was not" in text
    vllm = _candidate(both, "vllm").prediction_check
    assert isinstance(vllm, PredictionCheck)
    assert prediction_sentence(vllm) in text


def test_without_an_other_mix_sweep_the_prediction_is_unknown(folders: dict[str, Path]) -> None:
    result = capacity_of([folders["own"]])
    check = _candidate(result, "vllm").prediction_check
    assert isinstance(check, Unknown)
    assert check.reason == (
        "predicted: only this workload's own traffic was benchmarked on this deployment: no "
        "sweep at another mix to fit a model without it (benchmark another mix too)"
    )


def test_nothing_load_tested_leaves_the_document_as_it_was(short_only: CapacityResult) -> None:
    candidate = _candidate(short_only, "vllm")
    assert candidate.prediction_check is None
    assert "prediction_check" not in json.dumps(short_only.to_json())
    assert "predicted against measured" not in render_text(short_only)
    # The round trip keeps the check where there is one.
    known = candidate.model_copy(
        update={
            "prediction_check": prediction_check(3.3, 3.0, fitted_from=["a"], measured_from="b")
        }
    )
    again = CandidateCapacity.model_validate(json.loads(json.dumps(known.model_dump(mode="json"))))
    assert again.prediction_check == known.prediction_check


def test_each_missing_side_is_named() -> None:
    both_missing = prediction_check(
        Unknown(reason="no fit"), Unknown(reason="no sweep"), fitted_from=[], measured_from="x"
    )
    assert both_missing == Unknown(reason="predicted: no fit; measured: no sweep")
    check = prediction_check(2.0, 2.5, fitted_from=["a"], measured_from="b")
    assert isinstance(check, PredictionCheck) and check.error == pytest.approx(-0.2)
    assert prediction_sentence(check) == (
        "predicted 2 req/s per replica by the model fitted on a without this workload's own "
        "traffic; measured 2.5 req/s on it (b): error -20.0%"
    )


def test_an_own_traffic_sweep_that_never_failed_measures_no_capacity(
    tmp_path: Path, folders: dict[str, Path]
) -> None:
    """Only the passing rates of the own-traffic sweep: its capacity is above them, unmeasured."""
    own = tmp_path / "own-low"
    own.mkdir()
    for name in ("enginefit-bench.yaml", "vllm-10qps-own.json", "vllm-20qps-own.json"):
        (own / name).write_bytes((folders["own"] / name).read_bytes())
    check = _candidate(capacity_of([folders["short"], own]), "vllm").prediction_check
    assert isinstance(check, Unknown)
    assert check.reason.startswith("measured: vllm 0.11.0")
    assert check.reason.endswith(
        f"/ {WORKLOAD}: it met the SLO at every rate it sent, up to 20 req/s: its capacity lies "
        "above, unmeasured; load-test higher rates"
    )
