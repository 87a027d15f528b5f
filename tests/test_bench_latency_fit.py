"""Latency models fitted at the SLO capacity, and the trace's concurrency re-estimated with them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from assets.bench import ASSETS, CHECKS
from assets.resources import EnginefitStore
from pipeline.bench.latency_fit import (
    CONFIG_LABEL,
    estimate_concurrency,
    fit_latency_models,
    fitted_model,
)
from pipeline.bench.readers import read_bench_files
from pipeline.bench.schema import conform_load_points
from pipeline.bench.slo import evaluate_slo, slo_capacity
from pipeline.schema import conform
from pipeline.shape.facts import LatencyModel
from tests.bench_points import kept_up_run
from tests.conftest import DEFAULTS, bench_settings, write_requests

H100 = (
    Path(__file__).resolve().parent
    / "data"
    / "bench"
    / "inference-perf"
    / "kubecon-na-2025-vllm-h100"
)
MANIFEST = {
    "engine": "vllm",
    "engine_version": "0.11.0",
    "gpu_type": "H100-80GB",
    "gpu_count": 1,
    "run_date": "2025-11-05",
}
T0 = datetime(2025, 1, 1, tzinfo=UTC)
SLO = DEFAULTS.bench.slo  # ttft p95 <= 1000 ms, per-gap itl p99 <= 60 ms, error rate <= 1%


def point(engine: str, rate: float, ok: bool, **values: Any) -> dict[str, Any]:
    """One open-loop load point: passes the default SLO when ``ok``, else breaks TTFT p95."""
    row: dict[str, Any] = {
        "point_id": f"{engine}#{rate:g}",
        "engine": engine,
        "gpu_type": "G",
        "gpu_count": 1,
        "load_mode": "open",
        "offered_rate_rps": rate,
        "completed": 100,
        "failed": 0,
        "ttft_p95_ms": 500.0 if ok else 5000.0,
        "itl_p99_ms": 30.0,
        "ttft_p50_ms": 100.0,
        "tpot_p50_ms": 5.0,
        "itl_mean_ms": 4.0,
        "input_tokens_mean": 400.0,
        "output_tokens_mean": 100.0,
        **(kept_up_run(rate) if rate > 0 else {}),
    }
    row.update(values)
    return row


def fits_of(rows: list[dict[str, Any]]) -> pl.DataFrame:
    evaluated = evaluate_slo(conform_load_points(pl.DataFrame(rows)), bench_settings(slo=SLO))
    return fit_latency_models(evaluated, slo_capacity(evaluated, SLO))


def by_engine(fits: pl.DataFrame) -> dict[str, dict[str, Any]]:
    return {row["engine"]: row for row in fits.to_dicts()}


# --------------------------------------------------------------------------------------------
# Fitting


def test_fit_uses_the_capacity_point_and_hand_computed_parameters() -> None:
    fits = by_engine(
        fits_of(
            [
                # a: pass at 1 and 2, fail at 4 -> capacity point is rate 2 (TTFT 120 / 480 tokens)
                point("a", 1.0, True, ttft_p50_ms=60.0, input_tokens_mean=480.0),
                point("a", 2.0, True, ttft_p50_ms=120.0, input_tokens_mean=480.0, tpot_p50_ms=8),
                point("a", 4.0, False, ttft_p50_ms=900.0, tpot_p50_ms=20.0),
                # b: no TPOT at the capacity point -> falls back to the mean per-gap ITL
                point("b", 3.0, True, tpot_p50_ms=None, itl_mean_ms=12.0),
                point("b", 6.0, False),
            ]
        )
    )
    a = fits["a"]
    assert a["fitted"] is True and a["reason"] is None
    assert a["point_id"] == "a#2" and a["capacity_load"] == 2.0
    assert a["ttft_base_ms"] == 0.0
    assert a["ttft_per_prompt_token_ms"] == pytest.approx(120.0 / 480.0)  # 0.25 ms/token
    assert a["tpot_ms"] == 8.0 and a["tpot_from"] == "tpot_p50_ms"
    assert a["source"] == "benchmark:a / 1×G at 2 req/s"
    model = fitted_model(a)
    assert model == LatencyModel(0.0, 0.25, 8.0, "benchmark:a / 1×G at 2 req/s")

    b = fits["b"]
    assert b["fitted"] is True
    assert b["tpot_ms"] == 12.0 and b["tpot_from"].startswith("itl_mean_ms")
    assert b["ttft_per_prompt_token_ms"] == pytest.approx(100.0 / 400.0)
    assert b["source"] == "benchmark:b / 1×G at 3 req/s"


def test_missing_percentiles_and_missing_capacity_give_reasons_not_defaults() -> None:
    fits = by_engine(
        fits_of(
            [
                point("c", 1.0, True, ttft_p50_ms=None),
                point("c", 2.0, False),
                point("d", 1.0, True, tpot_p50_ms=None, itl_mean_ms=None, input_tokens_mean=None),
                point("e", 1.0, False),  # nothing passes: below range
                point("f", 1.0, True, ttft_p50_ms=float("nan")),
            ]
        )
    )
    assert fits["c"]["reason"] == "TTFT p50 missing at point c#1"
    assert fits["d"]["reason"] == (
        "mean input tokens missing; TPOT p50 and ITL mean both missing at point d#1"
    )
    assert fits["e"]["reason"] == (
        "no SLO capacity (capacity_status below_range): no load point to fit"
    )
    assert fits["f"]["reason"] == "TTFT p50 missing at point f#1"  # NaN counts as missing
    for row in fits.values():
        assert row["fitted"] is False
        assert row["ttft_per_prompt_token_ms"] is None and row["tpot_ms"] is None
        assert row["source"] is None
        assert fitted_model(row) is None


def test_closed_loop_capacity_is_labelled_in_users() -> None:
    rows = [
        point("g", 0.0, True, load_mode="closed", concurrency=8, offered_rate_rps=None),
        point("g", 0.0, False, load_mode="closed", concurrency=16, offered_rate_rps=None),
    ]
    rows[0]["point_id"], rows[1]["point_id"] = "g#8", "g#16"
    (row,) = fits_of(rows).to_dicts()
    assert row["sweep"] == "closed" and row["point_id"] == "g#8"
    assert row["source"] == "benchmark:g / 1×G at 8 concurrent users (closed loop)"


def test_no_capacity_rows_give_an_empty_fit_table() -> None:
    evaluated = evaluate_slo(
        conform_load_points(pl.DataFrame({"point_id": ["x"]})).clear(), bench_settings(slo=SLO)
    )
    assert fit_latency_models(evaluated, slo_capacity(evaluated, SLO)).height == 0


# --------------------------------------------------------------------------------------------
# Concurrency with the fitted models


def trace(arrivals_s: list[float], prompt: list[int], output: list[int]) -> pl.DataFrame:
    n = len(arrivals_s)
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": [T0 + timedelta(seconds=s) for s in arrivals_s],
                "prompt_tokens": prompt,
                "output_tokens": output,
                "source_file": ["t.jsonl"] * n,
                "source_line": list(range(1, n + 1)),
            }
        )
    )


def test_peak_concurrency_with_fitted_and_config_models_by_hand() -> None:
    fits = fits_of(
        [point("a", 2.0, True), point("a", 4.0, False), point("z", 1.0, False)]
    )  # a: 100 ms / 400 tokens = 0.25 ms/token, TPOT 5 ms; z: no capacity
    # Three requests 1 s apart, 4000 prompt tokens and 100 output tokens each; TPOT counts the
    # 99 tokens after the first.
    # fitted: 0 + 0.25 x 4000 + 5 x 99 = 1495 ms -> [0, 1.495), [1, 2.495), [2, 3.495): peak 2
    #         (at 1 s), busy 4.485 s over 3.495 s.
    # config: 50 + 0.05 x 4000 + 30 x 99 = 3220 ms -> [0, 3.22), [1, 4.22), [2, 5.22): peak 3
    #         (at 2 s), busy 9.66 s over 5.22 s.
    table = estimate_concurrency(
        trace([0, 1, 2], [4000] * 3, [100] * 3), fits, DEFAULTS.shape.latency
    )
    rows = {row["candidate"]: row for row in table.to_dicts()}
    assert table.get_column("model").to_list() == ["config", "benchmark", "benchmark"]
    config = rows[CONFIG_LABEL]
    assert config["peak_concurrency"] == 3 and config["peak_at"] == T0 + timedelta(seconds=2)
    assert config["mean_concurrency"] == pytest.approx(9.66 / 5.22)
    assert config["source"] == "config" and config["estimated"] is True
    a = rows["a / 1×G"]
    assert a["peak_concurrency"] == 2 and a["peak_at"] == T0 + timedelta(seconds=1)
    assert a["mean_concurrency"] == pytest.approx(4.485 / 3.495)
    assert a["peak_vs_config"] == pytest.approx(2 / 3)
    assert a["estimated"] is True and a["durations_estimated"] == 3
    assert (a["ttft_base_ms"], a["ttft_per_prompt_token_ms"], a["tpot_ms"]) == (0.0, 0.25, 5.0)
    assert "source: benchmark:a / 1×G at 2 req/s" in a["label"]
    # trace prompts 4000 vs benchmark 400 (10x); outputs 100 vs 100 (no note)
    assert a["note"] == (
        "trace mean prompt 4,000 tokens is 10x the benchmark's 400: TTFT extrapolated linearly "
        "from a zero base"
    )
    z = rows["z / 1×G"]
    assert z["peak_concurrency"] is None and z["estimated"] is None
    assert z["reason"].startswith("no SLO capacity")


def test_logged_durations_make_the_model_irrelevant() -> None:
    fits = fits_of([point("a", 2.0, True)])
    frame = trace([0, 1], [400, 400], [100, 100]).with_columns(
        e2e_ms=pl.lit(1500.0, dtype=pl.Float64)
    )
    table = estimate_concurrency(frame, fits, DEFAULTS.shape.latency)
    assert table.get_column("peak_concurrency").to_list() == [2, 2]
    assert table.get_column("estimated").to_list() == [False, False]
    assert "the model is not used" in table.item(1, "note")


# --------------------------------------------------------------------------------------------
# The committed inference-perf H100 sweep


def h100_fits() -> pl.DataFrame:
    if not H100.is_dir():
        pytest.skip("committed H100 sweep not available")
    evaluated = evaluate_slo(
        read_bench_files([H100], manifest=MANIFEST).load_points, bench_settings(slo=SLO)
    )
    return fit_latency_models(evaluated, slo_capacity(evaluated, SLO))


def test_h100_sweep_fit_matches_stage_3_by_hand() -> None:
    """Capacity is 92.19 req/s (stage 3; stage 4 at 122.59 breaks TTFT p95).

    stage_3_lifecycle_metrics.json, successes (seconds):
    latency.time_to_first_token.median = 0.04451845702715218 s -> 44.518457 ms,
    latency.time_per_output_token.median = 0.00741328114676181 s -> 7.413281 ms,
    prompt_len.mean = 204.10178991140842 tokens,
    so ttft_per_prompt_token_ms = 44.518457 / 204.101790 = 0.218119 ms/token.
    """
    (row,) = h100_fits().to_dicts()
    assert row["fitted"] is True
    assert row["point_id"].endswith("#3")
    assert row["capacity_load"] == pytest.approx(92.19)
    assert row["tpot_ms"] == pytest.approx(7.41328114676181)
    assert row["tpot_from"] == "tpot_p50_ms"
    assert row["ttft_base_ms"] == 0.0
    assert row["ttft_per_prompt_token_ms"] == pytest.approx(44.51845702715218 / 204.10178991140842)
    assert row["ttft_per_prompt_token_ms"] == pytest.approx(0.218119, abs=1e-6)
    assert row["source"] == (
        "benchmark:vllm 0.11.0 / meta-llama/Meta-Llama-3-8B-Instruct / 1×H100-80GB at 92.19 req/s"
    )


# --------------------------------------------------------------------------------------------
# The Dagster asset


def write_config(tmp_path: Path, bench: str = "") -> Path:
    config = tmp_path / "enginefit.yaml"
    config.write_text(
        "workload: {name: t, traces: [some/file], block_size: 16, hash_salt: test-salt}\n"
        f"paths: {{data_dir: {tmp_path / 'data'}, reports_dir: {tmp_path / 'reports'}}}\n"
        "shape: {latency_model: {ttft_base_ms: 50, ttft_per_prompt_token_ms: 0.05, tpot_ms: 30}}\n"
        + bench
    )
    return config


def materialize_asset(config: Path) -> dict[str, Any]:
    result = dg.materialize(
        [*ASSETS, *CHECKS],
        resources={"store": EnginefitStore(config_path=str(config))},
        raise_on_error=True,
    )
    (event,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("concurrency_by_engine")
    ]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_asset_without_bench_results_keeps_the_config_figure(tmp_path: Path) -> None:
    write_requests(trace([0, 1, 2], [4000] * 3, [100] * 3), tmp_path / "data" / "t")
    meta = materialize_asset(write_config(tmp_path))
    assert "no bench results configured" in str(meta["status"])
    assert meta["config_peak_concurrency"] == 3
    out = tmp_path / "data" / "t" / "bench"
    table = pl.read_parquet(out / "concurrency_by_engine.parquet")
    assert table.get_column("model").to_list() == ["config"]
    payload = json.loads((out / "concurrency_by_engine.json").read_text())
    assert payload["concurrency"][0]["peak_at"] == "2025-01-01T00:00:02.000000Z"
    assert payload["fits"] == []


def test_asset_on_h100_sweep(tmp_path: Path) -> None:
    if not H100.is_dir():
        pytest.skip("committed H100 sweep not available")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text("".join(f"{k}: {v}\n" for k, v in MANIFEST.items()))
    # 0.218119 ms/token x 4000 + 7.413281 ms x 100 = 1613.8 ms: [0, 1.61), [1, 2.61), [2, 3.61)
    write_requests(trace([0, 1, 2], [4000] * 3, [100] * 3), tmp_path / "data" / "t")
    meta = materialize_asset(
        write_config(tmp_path, f"bench:\n  results: [{H100}]\n  manifest: {manifest}\n")
    )
    assert meta["fitted_models"] == 1 and meta["config_peak_concurrency"] == 3
    table = pl.read_parquet(tmp_path / "data" / "t" / "bench" / "concurrency_by_engine.parquet")
    assert table.get_column("peak_concurrency").to_list() == [3, 2]
    assert table.get_column("estimated").to_list() == [True, True]
    assert "92.19 req/s" in str(meta["concurrency"])
