"""The validity join: each flag fires on hand-built cases and names its numbers."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.bench.checks import findings_well_formed
from pipeline.bench.compute import analyse_bench
from pipeline.bench.present import cost_svg
from pipeline.bench.result import analysis_payload
from pipeline.bench.schema import conform_load_points
from pipeline.bench.slo import order_statistic_interval
from pipeline.bench.validity import (
    ALL_CANDIDATES,
    FINDINGS_SCHEMA,
    LENGTH_FACTOR,
    comparability,
    workload_facts_from_dict,
)
from pipeline.capacity.compute import WorkloadRequests, transfer_distance
from pipeline.capacity.config import CapacityConfig
from pipeline.capacity.result import ServingModel
from pipeline.costing import Prices
from pipeline.errors import InputFormatError
from pipeline.shape.facts import Percentiles, WorkloadFacts
from tests.bench_points import kept_up_run
from tests.capacity_scenarios import fitted
from tests.conftest import DEFAULTS, bench_settings

AS_OF = dt.date(2026, 11, 29)


def facts(**kw: Any) -> WorkloadFacts:
    base: dict[str, Any] = {
        "requests": 1000,
        "span_s": 3600.0,
        "mean_rate_rps": 5.0,
        "peak_rate_rps": {"1s": 40.0, "60s": 20.0},
        "prompt_tokens": Percentiles(p50=500, p90=1500, p95=2500, p99=4000, max=9000),
        "output_tokens": Percentiles(p50=200, p90=400, p95=500, p99=800, max=2000),
        "peak_concurrency": 30.0,
        "peak_concurrency_estimated": True,
        "latency_model": DEFAULTS.shape.latency,
        "shared_prefix_ratio": {64: 0.7, 256: 0.4, 1024: 0.1},
    }
    base.update(kw)
    return WorkloadFacts(**base)


def pt(load: float, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "point_id": f"{kw.get('engine', 'vllm')}-{load:g}",
        "engine": "vllm",
        "model": "llama-8b",
        "gpu_type": "H100",
        "gpu_count": 1,
        "load_mode": "open",
        "offered_rate_rps": float(load),
        "ttft_p95_ms": 100.0 * load,
        "itl_p99_ms": 20.0,
        "completed": 100,
        "failed": 0,
        "output_tokens_per_s": 250.0 * load,
        "total_tokens_per_s": 1000.0 * load,
        "input_tokens_p50": 1000.0,
        "input_tokens_p99": 1000.0,
        "output_tokens_p50": 200.0,
        "dataset": "random",
        "run_date": dt.date(2026, 1, 1),
        "output_tokens_mean": 250.0,
        "input_tokens_mean": 750.0,
    }
    if load > 0:
        row.update(kept_up_run(load))
    row.update(kw)
    return row


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return conform_load_points(pl.DataFrame(rows, infer_schema_length=None))


def finding(findings: pl.DataFrame, check: str, candidate: str | None = None) -> dict[str, Any]:
    rows = findings.filter(pl.col("check") == check)
    if candidate is not None:
        rows = rows.filter(pl.col("candidate").str.starts_with(candidate))
    assert rows.height == 1, rows
    return rows.row(0, named=True)


SETTINGS = bench_settings(prices=Prices(default=3.0))


def analyse(rows: list[dict[str, Any]], wf: WorkloadFacts | None = None, **kw: Any) -> Any:
    return analyse_bench(frame(rows), SETTINGS.replace(**kw), wf, as_of=AS_OF)


def test_workload_facts_json_round_trip() -> None:
    original = facts()
    text = json.dumps(original.as_dict())  # int keys of shared_prefix_ratio become strings
    assert workload_facts_from_dict(json.loads(text)) == original


def test_workload_facts_nulls_and_errors() -> None:
    raw = json.loads(json.dumps(facts(latency_model=None).as_dict()))
    raw["mean_rate_rps"] = None
    raw["prompt_tokens"]["p99"] = None
    parsed = workload_facts_from_dict(raw)
    assert math.isnan(parsed.mean_rate_rps)
    assert math.isnan(parsed.prompt_tokens.p99)
    assert parsed.latency_model is None
    del raw["span_s"]
    with pytest.raises(InputFormatError, match="missing field 'span_s'"):
        workload_facts_from_dict(raw, where="shape/workload_facts.json")


def test_each_flag_fires_with_its_numbers() -> None:
    rows = [pt(1), pt(5), pt(12)]  # sweep tops out at 12 req/s; fails at 12 (ttft 1200)
    a = analyse(rows, facts())
    f = a.findings
    fixed = finding(f, "fixed_length_prompts")
    assert fixed["status"] == "flag"
    assert fixed["bench_value"] == 1.0
    assert fixed["prod_value"] == 8.0  # 4000 / 500
    assert "p99/p50 = 8.00 (p50 500, p99 4000)" in fixed["message"]
    prompt = finding(f, "prompt_length")
    assert prompt["status"] == "ok"  # 1000 vs 500 is exactly ×2: within tolerance
    assert "ratio 2" in prompt["message"]
    prefix = finding(f, "prefix_structure")
    assert prefix["status"] == "flag"
    assert prefix["prod_value"] == 0.7
    assert "70% at W=64" in prefix["message"] and "random" in prefix["message"]
    peak = finding(f, "peak_rate")
    assert peak["status"] == "flag"
    # The sweep offered 12 req/s but sustained only 5 within the SLO (12 fails on TTFT).
    assert (peak["bench_value"], peak["prod_value"]) == (5.0, 20.0)
    assert peak["message"] == (
        "highest load sustained within the SLO 5 req/s (highest offered 12 req/s); production "
        "peak (60s window) is 20 req/s: the benchmark never showed production's peak rate "
        "sustained"
    )
    stale = finding(f, "stale")
    assert stale["status"] == "flag"
    assert stale["bench_value"] == (AS_OF - dt.date(2026, 1, 1)).days == 332
    assert "332 days before 2026-11-29 (limit 183 days)" in stale["message"]
    assert finding(f, "closed_loop")["status"] == "ok"
    assert finding(f, "comparability")["candidate"] == ALL_CANDIDATES
    assert findings_well_formed(f) == []
    assert dict(f.schema) == FINDINGS_SCHEMA


def test_ok_cases_and_length_mismatch() -> None:
    rows = [
        pt(
            r,
            input_tokens_p50=120.0,
            input_tokens_p99=900.0,
            dataset="shared_prefix",
            run_date=dt.date(2026, 10, 1),
            ttft_p95_ms=300.0,  # both pass: 25 req/s sustained covers the 20 req/s peak
        )
        for r in (10, 25)
    ]
    a = analyse(rows, facts())
    f = a.findings
    assert finding(f, "fixed_length_prompts")["status"] == "ok"
    prompt = finding(f, "prompt_length")
    assert prompt["status"] == "flag"  # 120 vs 500 = 0.24, outside ×2
    assert "ratio 0.24 outside" in prompt["message"]
    assert finding(f, "prefix_structure")["status"] == "ok"  # shared vs 70% sharing
    assert finding(f, "peak_rate")["status"] == "ok"
    assert finding(f, "stale")["status"] == "ok"


def test_shared_prefix_benchmark_vs_unshared_production() -> None:
    rows = [pt(1, dataset="shared_prefix")]
    f = analyse(rows, facts(shared_prefix_ratio={64: 0.05})).findings
    prefix = finding(f, "prefix_structure")
    assert prefix["status"] == "flag"
    assert "cache benchmark" in prefix["message"]


def test_unknowns_are_said_not_assumed() -> None:
    rows = [pt(1, input_tokens_p50=None, input_tokens_p99=None, dataset=None, run_date=None)]
    f = analyse(rows, facts(shared_prefix_ratio={})).findings
    assert finding(f, "fixed_length_prompts")["status"] == "unknown"
    prefix = finding(f, "prefix_structure")
    assert prefix["status"] == "unknown"
    assert "production shared-prefix ratio unknown" in prefix["message"]
    assert finding(f, "stale")["status"] == "unknown"
    no_facts = analyse([pt(1)], None).findings
    for check in ("fixed_length_prompts", "prompt_length", "prefix_structure", "peak_rate"):
        row = finding(no_facts, check)
        assert row["status"] == "unknown"
        assert "no workload facts" in row["message"]
    no_date = analyse_bench(frame([pt(1)]), SETTINGS, None, as_of=None).findings
    assert "no report date given" in finding(no_date, "stale")["message"]


def test_closed_loop_flagged() -> None:
    rows = [
        pt(0, load_mode="closed", offered_rate_rps=None, concurrency=c, request_throughput_rps=c)
        for c in (1, 4, 16)
    ]
    closed = finding(analyse(rows, facts()).findings, "closed_loop")
    assert closed["status"] == "flag"
    assert (
        "3 closed-loop point(s) at concurrency 1, 4, 16 and no open-loop sweep"
        in (closed["message"])
    )
    assert finding(analyse(rows, facts()).findings, "peak_rate")["status"] == "unknown"


def test_not_comparable_candidates_are_not_ranked() -> None:
    rows = [pt(1), pt(5)]
    rows += [
        pt(1, engine="sglang", gpu_type="L40S", model="llama-70b"),
        pt(5, engine="sglang", gpu_type="L40S", model="llama-70b"),
    ]
    a = analyse(rows, facts())
    ok, diffs = comparability(a.evaluated)
    assert not ok and not a.comparable
    assert any(d.startswith("model differs") and "llama-70b" in d for d in diffs)
    assert any(d.startswith("gpu_type differs") for d in diffs)
    comp = finding(a.findings, "comparability")
    assert comp["status"] == "flag"
    assert "not comparable, so not ranked" in comp["message"]
    assert a.capacity.get_column("cost_rank").to_list() == [None, None]


def test_comparable_candidates_ranked_by_cost() -> None:
    rows = [pt(1), pt(5), pt(12)]  # vllm passes 5 (1250 tok/s), fails 12 (TTFT 1200 ms)
    # sglang passes 8 (2000 tok/s), fails 16 (TTFT 1600 ms)
    rows += [
        pt(r, engine="sglang", ttft_p95_ms=100.0 * r if r > 8 else 50.0 * r) for r in (1, 5, 8, 16)
    ]
    a = analyse(rows, facts())
    assert a.comparable
    ranks = dict(a.capacity.select("engine", "cost_rank").rows())
    assert ranks == {"sglang": 1, "vllm": 2}
    costs = dict(a.capacity.select("engine", "cost_per_1m_output_usd").rows())
    assert costs["vllm"] == pytest.approx(3.0 / (1250 * 3600) * 1e6)
    assert costs["sglang"] == pytest.approx(3.0 / (2000 * 3600) * 1e6)
    fleet = {(r["engine"], r["rate_label"]): r for r in a.fleet.to_dicts()}
    assert fleet[("vllm", "peak_60s")]["gpus"] == 4  # ceil(20 / 5)
    assert fleet[("sglang", "peak_60s")]["gpus"] == 3  # ceil(20 / 8)
    assert fleet[("sglang", "mean")]["monthly_usd"] == pytest.approx(1 * 3.0 * 730)
    payload = analysis_payload(a)
    json.dumps(payload)  # JSON-ready
    assert payload["rates_rps"] == {"mean": 5.0, "peak_60s": 20.0}


def test_lower_bounds_and_single_points_are_ranked_apart() -> None:
    rows = [pt(1), pt(5), pt(12)]  # vllm: bracketed at 5 (1250 tok/s)
    # sglang: passes 1 and 8, never fails: capacity ≥ 8 (2000 tok/s), cheaper but only a bound
    rows += [pt(r, engine="sglang", ttft_p95_ms=50.0 * r) for r in (1, 8)]
    rows += [pt(3, engine="trtllm", ttft_p95_ms=100.0)]  # one load tried: 750 tok/s
    a = analyse(rows, facts())
    table = {r["engine"]: r for r in a.capacity.to_dicts()}
    assert {e: (r["rank_pool"], r["cost_rank"]) for e, r in table.items()} == {
        "vllm": ("bracketed", 1),
        "sglang": ("lower_bound", 1),
        "trtllm": ("single_point", 1),
    }
    # sglang is the cheapest figure, but it is not in the main ranking
    assert table["sglang"]["cost_per_1m_output_usd"] < table["vllm"]["cost_per_1m_output_usd"]
    assert table["trtllm"]["n_loads"] == 1
    assert any(
        n.startswith("ranked apart as lower_bound (no failing load, so capacity and cost are only")
        and "sglang" in n
        for n in a.notes
    )
    assert any(
        n.startswith("ranked apart as single_point (one load tried): trtllm") for n in a.notes
    )
    svg = cost_svg(a.capacity).decode()
    for colour in ("#0072b2", "#e69f00", "#7f7f7f"):  # one bar colour per pool
        assert colour in svg
    payload = analysis_payload(a)
    assert {row["rank_pool"] for row in payload["capacity"]} == {
        "bracketed",
        "lower_bound",
        "single_point",
    }


@pytest.mark.shared
def test_l40s_aggregates_cannot_show_keep_up() -> None:
    """The real L40S sample: three deployments at 10 and 30 req/s (plus bursts), aggregates only,
    no E2E. With the drain left in they completed 83-84 % and 73-74 % of the send rate, and
    without the longest latency the drain cannot be bounded: every open point is keep-up
    unknown, so no capacity is claimed rather than a guessed one."""
    from pipeline.bench.config import parse_slo_spec
    from pipeline.bench.readers import read_bench_files
    from tests.conftest import shared_path

    path = shared_path("bench-samples", "vllm-bench-serve", "nerdalert_l40s_llmd_results.jsonl")
    manifest = {"engine": "vllm", "gpu_type": "L40S", "gpu_count": 4, "label_from": "deployment"}
    points = read_bench_files([path], manifest=manifest).load_points
    settings = SETTINGS.replace(
        slo=parse_slo_spec("ttft_p99_ms=1000,itl_p99_ms=100", DEFAULTS.bench.slo),
        prices=Prices(gpu_hour_usd={"L40S": 1.2}),
    )
    a = analyse_bench(points, settings, None, as_of=AS_OF)
    open_rows = a.capacity.filter(pl.col("sweep") == "open").sort("label")
    assert open_rows.get_column("capacity_status").to_list() == ["unknown"] * 3
    assert open_rows.get_column("capacity_rps").to_list() == [None] * 3
    base = a.evaluated.filter((pl.col("label") == "base") & (pl.col("offered_rate_rps") == 10.0))
    assert base.item(0, "keep_up_reason").startswith(
        "keep-up unknown: 300 completed ÷ 36.2 s = 8.288 req/s, drain included, is 83% of the "
        "send rate 10 req/s and the longest latency is not recorded"
    )


# ---- tail percentiles carry their order-statistic interval ------------------------------


def _interval_by_counting(n: int, q: float) -> tuple[int | None, int | None]:
    """The same 95 % interval from exact binomial sums with integer combinatorics (an
    independent reference): the largest r with P(X ≤ r − 1) ≤ 2.5 % and the smallest s with
    P(X ≤ s − 1) ≥ 97.5 %, X ~ Binomial(n, q), within 1..n."""
    pmf = [math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(n + 1)]
    cdf = [sum(pmf[: k + 1]) for k in range(n + 1)]
    lower = max((r for r in range(1, n + 1) if cdf[r - 1] <= 0.025), default=None)
    upper = min((s for s in range(1, n + 1) if cdf[s - 1] >= 0.975), default=None)
    return lower, upper


@pytest.mark.parametrize(
    ("n", "q"), [(100, 0.99), (367, 0.99), (368, 0.99), (1000, 0.99), (20, 0.95), (200, 0.95)]
)
def test_the_order_statistic_interval_matches_exact_binomial_sums(n: int, q: float) -> None:
    assert order_statistic_interval(n, q) == _interval_by_counting(n, q)


def test_a_p99_from_100_requests_is_the_sample_maximum_and_says_so() -> None:
    """The capacity point (4 req/s, the highest passing) ran 100 requests: its p99 ITL is their
    maximum, the interval for the true p99 runs from the 97th value to beyond the largest;
    1,000 requests would bound it (983rd to 997th). A sweep of 1,000 requests a point passes."""
    assert order_statistic_interval(100, 0.99) == (97, None)
    assert order_statistic_interval(1000, 0.99) == (983, 997)
    thin = finding(analyse([pt(1), pt(4), pt(16)]).findings, "tail_sample")
    assert (thin["status"], thin["bench_value"], thin["threshold"]) == ("flag", 100.0, 1000.0)
    assert thin["message"] == (
        "p99 ITL (per-gap) at the capacity point rests on 100 requests (it is the sample's "
        "maximum: the 95 % order-statistic interval for the true p99 runs from the 97th of 100 "
        "values to beyond the largest, unbounded above); about 1,000 bound it (95 % "
        "order-statistic interval: the p99 lies between the 983rd and 997th of 1,000 values)"
    )
    rows = [{**pt(load), **kept_up_run(load, requests=1_000)} for load in (1, 4, 16)]
    ample = finding(analyse(rows).findings, "tail_sample")
    assert ample["status"] == "ok" and ample["message"].endswith("; enough for it")


def test_the_bench_and_capacity_stages_share_one_transfer_distance() -> None:
    """A workload whose prompts are 3× the benchmark's: the bench stage flags the length
    mismatch (past LENGTH_FACTOR = 2), and the capacity stage's transfer of the fitted model is
    far, so provisional, past the same factor (it used its own 4×, which let this one pass);
    at 1.5× neither does."""
    model = fitted("short")
    assert isinstance(model, ServingModel)
    prompt = model.bench_prompt_tokens_mean
    output = int(model.bench_output_tokens_mean)

    def mix(factor: float) -> WorkloadRequests:
        n = 200
        return WorkloadRequests(
            prompt=np.full(n, int(prompt * factor), dtype=np.int64),
            output=np.full(n, output, dtype=np.int64),
            cached=np.zeros(n, dtype=np.int64),
        )

    assert LENGTH_FACTOR == 2.0 and "far_ratio" not in CapacityConfig.model_fields
    assert transfer_distance(model, mix(3.0)).far
    assert not transfer_distance(model, mix(1.5)).far
    bench = pt(1, input_tokens_p50=prompt, input_tokens_p99=prompt)
    for factor, status in ((3.0, "flag"), (1.5, "ok")):
        production = Percentiles(
            p50=prompt * factor,
            p90=prompt * factor,
            p95=prompt * factor,
            p99=prompt * factor,
            max=prompt * factor,
        )
        found = finding(analyse([bench], facts(prompt_tokens=production)).findings, "prompt_length")
        assert found["status"] == status
