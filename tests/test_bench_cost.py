"""Cost per 1M tokens, prices and fleet sizing, against hand-computed figures."""

from __future__ import annotations

import math
from typing import Any

import polars as pl
import pytest

from pipeline.bench.cost import (
    attach_prices,
    cost_gap_vs_noise,
    cost_per_million,
    fleet_cost,
    workload_rates,
)
from pipeline.bench.schema import conform_load_points
from pipeline.bench.slo import evaluate_slo, slo_capacity
from pipeline.costing import HOURS_PER_MONTH, Prices
from tests.bench_points import kept_up_run
from tests.conftest import DEFAULTS, bench_settings


def cap_row(**kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "engine": "vllm",
        "gpu_type": "H100",
        "gpu_count": 1,
        "sweep": "open",
        "capacity_rps": 10.0,
        "output_throughput_tps": 2500.0,
        "total_throughput_tps": 10000.0,
        "price_per_gpu_hour_usd": None,
    }
    row.update(kw)
    return row


def caps(*rows: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(
        list(rows),
        schema_overrides={
            "price_per_gpu_hour_usd": pl.Float64,
            "capacity_rps": pl.Float64,
            "repeats": pl.UInt32,
            "repeat_output_tps": pl.List(pl.Float64),
        },
    )


def test_domain_worked_example() -> None:
    """docs/decision-rules.md#cost-formula: $3.00/h at 2,500 tok/s -> $0.33; at 3,000 tok/s -> $0.28
    (17% apart)."""
    out = cost_per_million(
        caps(cap_row(), cap_row(engine="sglang", output_throughput_tps=3000.0)),
        Prices(default=3.0),
    )
    costs = out.get_column("cost_per_1m_output_usd").to_list()
    assert costs[0] == pytest.approx(3.0 / (2500 * 3600) * 1e6)
    assert round(costs[0], 2) == 0.33
    assert round(costs[1], 2) == 0.28
    assert 1 - costs[1] / costs[0] == pytest.approx(1 / 6)  # "a 17% difference"
    # per 1M total tokens: 3 / (10000 * 3600) * 1e6
    assert out.item(0, "cost_per_1m_total_usd") == pytest.approx(0.083333, rel=1e-5)
    assert out.item(0, "cost_workings") == (
        "1 GPU × $3.0/h ÷ (2500.0 output tok/s × 3600) × 10^6 = $0.3333 per 1M output tokens"
    )


def test_gpu_count_multiplies() -> None:
    out = cost_per_million(caps(cap_row(gpu_count=4)), Prices(default=2.0))
    assert out.item(0, "cost_per_1m_output_usd") == pytest.approx(4 * 2.0 / (2500 * 3600) * 1e6)
    assert out.item(0, "deployment_usd_per_hour") == 8.0


def test_no_price_or_no_throughput_gives_null_cost() -> None:
    out = cost_per_million(
        caps(cap_row(), cap_row(engine="x", output_throughput_tps=None)), Prices()
    )
    assert out.get_column("cost_per_1m_output_usd").to_list() == [None, None]
    assert out.get_column("price_source").to_list() == ["no price", "no price"]
    priced = cost_per_million(caps(cap_row(output_throughput_tps=0.0)), Prices(default=1.0))
    assert priced.item(0, "cost_per_1m_output_usd") is None


def test_price_precedence() -> None:
    frame = caps(
        cap_row(gpu_type="NVIDIA-H100-80GB", price_per_gpu_hour_usd=9.0),  # config type wins
        cap_row(gpu_type="A100", price_per_gpu_hour_usd=1.5),  # manifest beats default
        cap_row(gpu_type="MI300X"),  # default
        cap_row(gpu_type=None),  # default
    )
    prices = Prices(gpu_hour_usd={"H100": 3.0, "L40S": 1.2}, default=2.0)
    out = attach_prices(frame, prices)
    assert out.get_column("gpu_hour_usd").to_list() == [3.0, 1.5, 2.0, 2.0]
    assert out.get_column("price_source").to_list() == [
        "config gpu_hour_usd.H100",
        "manifest price_per_gpu_hour_usd",
        "config gpu_hour_usd.default",
        "config gpu_hour_usd.default",
    ]
    overridden = attach_prices(frame, Prices(gpu_hour_usd={"H100": 3.0}, override=0.5))
    assert overridden.get_column("gpu_hour_usd").to_list() == [0.5] * 4
    assert set(overridden.get_column("price_source").to_list()) == {"--gpu-hour-usd"}


def test_fleet_sizing_hand_computed() -> None:
    costed = cost_per_million(
        caps(
            cap_row(capacity_rps=100.0, gpu_count=2),
            cap_row(engine="exact", capacity_rps=92.19),
            cap_row(engine="none", capacity_rps=None),
        ),
        Prices(default=3.0),
    )
    fleet = fleet_cost(costed, {"mean": 92.19, "peak_60s": 250.0}, ["engine"])
    rows = {(r["engine"], r["rate_label"]): r for r in fleet.to_dicts()}
    peak = rows[("vllm", "peak_60s")]
    assert (peak["replicas"], peak["gpus"]) == (3, 6)  # ceil(250/100)=3 replicas × 2 GPUs
    assert peak["monthly_usd"] == pytest.approx(6 * 3.0 * HOURS_PER_MONTH)  # $13,140
    assert peak["fleet_workings"] == (
        "ceil(250.0 ÷ 100.0) = 3 replicas × 2 GPU = 6 GPUs × $3.0/h × 730 h = $13140.0/month"
    )
    assert rows[("vllm", "mean")]["replicas"] == 1
    assert rows[("exact", "mean")]["replicas"] == 1  # 92.19 / 92.19 is one replica, not two
    assert rows[("exact", "peak_60s")]["replicas"] == math.ceil(250 / 92.19)
    none = rows[("none", "mean")]
    assert none["replicas"] is None and none["monthly_usd"] is None
    assert "no capacity" in none["fleet_workings"]


def test_workload_rates_window_choice() -> None:
    peaks = {"1s": 40.0, "10s": 25.0, "60s": 20.0}
    assert workload_rates(5.0, peaks, "60s") == {"mean": 5.0, "peak_60s": 20.0}
    assert workload_rates(5.0, {"1s": 40.0, "10s": 25.0}, "60s") == {
        "mean": 5.0,
        "peak_10s": 25.0,
    }
    assert workload_rates(math.nan, {}, "60s") == {}


def test_manifest_price_survives_the_capacity_search() -> None:
    """slo_capacity groups by candidate keys without the price: it must carry it through."""
    slo = DEFAULTS.bench.slo
    rows = [
        {
            "point_id": f"p{rate}",
            "engine": "vllm",
            "gpu_type": "H100",
            "gpu_count": 2,
            "price_per_gpu_hour_usd": 3.5,
            "load_mode": "open",
            "offered_rate_rps": rate,
            "ttft_p95_ms": ttft,
            "itl_p99_ms": 20.0,
            "output_tokens_mean": 250.0,
            **kept_up_run(rate),
        }
        for rate, ttft in ((4.0, 300.0), (8.0, 3000.0))
    ]
    points = conform_load_points(pl.DataFrame(rows))
    capacity = slo_capacity(evaluate_slo(points, bench_settings(slo=slo)), slo)
    assert capacity.item(0, "price_per_gpu_hour_usd") == 3.5
    costed = cost_per_million(capacity, Prices(default=3.0))
    assert costed.item(0, "gpu_hour_usd") == 3.5
    assert costed.item(0, "price_source") == "manifest price_per_gpu_hour_usd"
    # 2 GPUs × $3.5/h ÷ (4 req/s × 250 tokens × 3600) × 10^6 = $1.9444
    assert costed.item(0, "cost_per_1m_output_usd") == pytest.approx(7.0 / (1000 * 3600) * 1e6)
    fleet = fleet_cost(costed, {"peak_60s": 10.0}, ["engine"])
    # ceil(10 / 4) = 3 replicas × 2 GPUs = 6 GPUs × $3.5 × 730 h
    assert fleet.item(0, "monthly_usd") == pytest.approx(6 * 3.5 * 730)
    assert Prices().default is None
    unpriced = cost_per_million(capacity, Prices())
    assert unpriced.item(0, "price_source") == "manifest price_per_gpu_hour_usd"


def test_cost_workings_show_the_whole_run_rate_and_difference() -> None:
    row = cap_row(
        output_throughput_tps=2500.0,
        sustained_rate_rps=10.0,
        output_tokens_mean=250.0,
        whole_run_output_tps=2000.0,
        output_rate_basis="sustained: send rate × mean output tokens",
    )
    out = cost_per_million(caps(row), Prices(default=3.0))
    # 2000 / 2500 − 1 = −20 %; $3 ÷ (2000 × 3600) × 10^6 = $0.4167
    assert out.item(0, "whole_run_vs_sustained") == pytest.approx(-0.2)
    assert out.item(0, "whole_run_cost_per_1m_output_usd") == pytest.approx(3 / 7.2e6 * 1e6)
    assert out.item(0, "cost_workings") == (
        "1 GPU × $3.0/h ÷ (2500.0 output tok/s × 3600) × 10^6 = $0.3333 per 1M output tokens; "
        "output rate sustained = 10.0 req/s sent × 250.0 mean output tokens; the tool's "
        "whole-run rate 2000.0 tok/s differs by -20.0% (drain tail) and would give $0.4167"
    )
    whole = cap_row(output_rate_basis="whole-run: mean output tokens unknown")
    assert (
        cost_per_million(caps(whole), Prices(default=3.0))
        .item(0, "cost_workings")
        .endswith("; output rate whole-run: mean output tokens unknown")
    )


# ------------------------------------------------------------------ noise from repeats


def test_cost_spread_over_repeats_by_hand() -> None:
    out = cost_per_million(
        caps(cap_row(repeats=3, repeat_output_tps=[2000.0, 2500.0, 2400.0])), Prices(default=3.0)
    )
    # cost ∝ 1/rate: 1/2000, 1/2500, 1/2400 = 5.0e-4, 4.0e-4, 4.1667e-4 (× a constant)
    inv = [1 / 2000, 1 / 2500, 1 / 2400]
    mean = sum(inv) / 3
    assert out.item(0, "cost_spread") == pytest.approx((max(inv) - min(inv)) / mean)  # 0.2264
    sd = math.sqrt(sum((x - mean) ** 2 for x in inv) / 2)
    assert out.item(0, "cost_cv") == pytest.approx(sd / mean)
    single = cost_per_million(caps(cap_row(repeats=1, repeat_output_tps=[2500.0])), Prices())
    assert single.item(0, "cost_spread") is None


def ranked(*rows: dict[str, Any]) -> pl.DataFrame:
    costed = cost_per_million(caps(*rows), Prices(default=3.0)).with_columns(
        rank_pool=pl.lit("bracketed"),
        cost_rank=pl.col("cost_per_1m_output_usd").rank("min").cast(pl.Int64),
    )
    return cost_gap_vs_noise(costed)


def test_gap_to_the_cheapest_against_the_noise() -> None:
    out = ranked(
        cap_row(
            engine="a", output_throughput_tps=3000.0, repeats=2, repeat_output_tps=[3000.0, 3100.0]
        ),
        cap_row(engine="b", output_throughput_tps=2500.0),  # 20 % dearer than a
        cap_row(engine="c", output_throughput_tps=2990.0),  # 0.33 % dearer than a
    )
    rows = {r["engine"]: r for r in out.to_dicts()}
    # a's noise: costs ∝ 1/3000, 1/3100 -> range / mean = (1/3000 − 1/3100) / mean = 3.28 %
    noise = (1 / 3000 - 1 / 3100) / ((1 / 3000 + 1 / 3100) / 2)
    assert rows["a"]["noise_share"] == pytest.approx(noise)
    assert rows["a"]["noise_note"] == "cheapest of its pool; noise 3.3% (2 repeats)"
    assert rows["b"]["cost_gap_share"] == pytest.approx(3000 / 2500 - 1)  # 0.2
    assert rows["b"]["gap_exceeds_noise"] is True
    assert rows["b"]["noise_note"].startswith("20.0% above the cheapest > the noise 3.3%")
    assert rows["c"]["gap_exceeds_noise"] is False
    assert rows["c"]["noise_note"].startswith("0.3% above the cheapest ≤ the noise 3.3%")
    bare = ranked(
        cap_row(engine="a", output_throughput_tps=3000.0),
        cap_row(engine="b", output_throughput_tps=2500.0),
    )
    notes = dict(bare.select("engine", "noise_note").rows())
    assert notes == {
        "a": "cheapest of its pool; no repeats: noise unknown",
        "b": "20.0% above the cheapest; no repeats: noise unknown",
    }
    assert bare.get_column("gap_exceeds_noise").to_list() == [None, None]
