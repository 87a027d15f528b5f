"""Shape metrics on the real Azure code and Mooncake conversation traces (skipped without ../shared).

Each trace is read here with polars directly (not through the ingestion readers), and the
figures are checked against the measured facts in its SOURCE.md and against a straightforward
numpy implementation written in this file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.schema import conform
from pipeline.shape.compute import compute_shape
from tests.conftest import DEFAULTS, shared_path

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def azure() -> pl.DataFrame:
    path = shared_path("traces", "azure-llm-2023", "AzureLLMInferenceTrace_code.csv")
    raw = pl.read_csv(path)
    return conform(
        raw.select(
            pl.col("TIMESTAMP")
            .str.strptime(pl.Datetime("ns"), "%Y-%m-%d %H:%M:%S%.f")
            .dt.replace_time_zone("UTC")
            .alias("arrival"),
            pl.col("ContextTokens").alias("prompt_tokens"),
            pl.col("GeneratedTokens").alias("output_tokens"),
        )
    )


@pytest.fixture(scope="module")
def azure_shape(azure: pl.DataFrame) -> dict[str, Any]:
    return compute_shape(azure.lazy(), DEFAULTS.shape).to_json()


@pytest.fixture(scope="module")
def mooncake() -> pl.DataFrame:
    path = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    raw = pl.read_ndjson(path)
    return conform(
        raw.select(
            (pl.datetime(2000, 1, 1, time_zone="UTC") + pl.duration(milliseconds="timestamp"))
            .dt.cast_time_unit("us")
            .alias("arrival"),
            pl.col("input_length").alias("prompt_tokens"),
            pl.col("output_length").alias("output_tokens"),
        )
    )


def nearest(values: np.ndarray, q: float) -> float:
    s = np.sort(values)
    return float(s[math.floor((len(s) - 1) * q + 0.5)])


def test_azure_matches_source_facts(azure_shape: dict[str, Any]) -> None:
    a = azure_shape["arrivals"]
    assert azure_shape["requests"] == 8_819
    assert round(a["span_s"]) == 3_436
    assert round(a["mean_rate_rps"], 2) == 2.57
    assert round(a["inter_arrival"]["cv"], 2) == 13.15
    assert round(a["windows"]["1s"]["index_of_dispersion"], 1) == 13.2
    assert a["windows"]["1s"]["peak_count"] == 67
    p = azure_shape["lengths"]["prompt_tokens"]
    assert (p["p50"], p["p90"], p["p99"], p["max"]) == (1_469, 5_186, 7_436, 7_437)
    o = azure_shape["lengths"]["output_tokens"]
    assert (o["p50"], o["p90"], o["p99"], o["max"]) == (13, 55, 252, 1_899)
    assert a["inter_arrival"]["max_gap_starts"].startswith("2023-11-16T19:04:39.80")
    assert round(a["inter_arrival"]["max_gap_s"]) == 217
    assert not a["quantisation"]["quantised"]
    assert a["hour_of_day"]["supported"] is False


def test_azure_matches_numpy_reference(azure: pl.DataFrame, azure_shape: dict[str, Any]) -> None:
    t = azure["arrival"].dt.epoch("us").to_numpy()
    gaps = np.diff(np.sort(t)) / 1e6
    a = azure_shape["arrivals"]
    assert a["inter_arrival"]["cv"] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-9)
    for w in (1, 10, 60):
        # Complete windows only: from the first one starting at or after the first arrival to
        # the last one ending at or before the last arrival.
        w_us = w * 1_000_000
        lo, hi = -(-t.min() // w_us), t.max() // w_us - 1
        b = t // w_us
        counts = np.bincount(b[(b >= lo) & (b <= hi)] - lo, minlength=hi - lo + 1)
        got = a["windows"][f"{w}s"]
        assert got["bins"] == hi - lo + 1
        assert got["peak_count"] == counts.max()
        assert got["index_of_dispersion"] == pytest.approx(counts.var() / counts.mean(), rel=1e-9)
    for col in ("prompt_tokens", "output_tokens"):
        values = azure[col].to_numpy()
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)):
            assert azure_shape["lengths"][col][name] == nearest(values, q)


def test_azure_estimated_concurrency_matches_numpy_sweep(
    azure: pl.DataFrame, azure_shape: dict[str, Any]
) -> None:
    lm = DEFAULTS.shape.latency
    start = azure["arrival"].dt.epoch("us").to_numpy()
    dur_ms = (
        lm.ttft_base_ms
        + lm.ttft_per_prompt_token_ms * azure["prompt_tokens"].to_numpy()
        + lm.tpot_ms * np.maximum(azure["output_tokens"].to_numpy() - 1, 0)
    )
    end = start + np.round(dur_ms * 1000).astype(np.int64)
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones_like(start), -np.ones_like(end)])
    order = np.lexsort((delta, times))  # by time, then -1 before +1
    level = np.cumsum(delta[order])
    c = azure_shape["concurrency"]
    assert c["peak"] == level.max()
    assert c["estimated"] and c["latency_model"]["source"] == "config"


def test_mooncake_quantisation_and_lengths(mooncake: pl.DataFrame) -> None:
    shape = compute_shape(mooncake.lazy(), DEFAULTS.shape).to_json()
    q = shape["arrivals"]["quantisation"]
    assert q["quantised"] and q["distinct_timestamps"] == 1_180
    assert q["quantum_s"] == 3.0
    assert (q["min_distinct_gap_s"], q["max_distinct_gap_s"]) == (2.997, 3.003)
    w = shape["arrivals"]["windows"]
    # Only windows holding a whole number of 3 s buckets: 10 s windows hold 3 or 4 and alias.
    assert not w["1s"]["supported"] and not w["10s"]["supported"] and w["60s"]["supported"]
    assert "a 10 s window is not a whole number of buckets" in w["10s"]["reason"]
    # The estimated concurrency is labelled as affected by the bucketing.
    effect = shape["concurrency"]["quantisation"]
    assert effect["affected"] and effect["quantum_s"] == 3.0
    assert "may be overstated by up to one bucket's arrivals" in effect["note"]
    assert not shape["arrivals"]["inter_arrival"]["supported"]
    assert shape["requests"] == 12_031 and round(shape["arrivals"]["mean_rate_rps"], 2) == 3.40
    p, o = shape["lengths"]["prompt_tokens"], shape["lengths"]["output_tokens"]
    assert (p["p50"], p["p90"], p["p99"], p["max"]) == (6_909, 27_367, 85_401, 126_195)
    assert (o["p50"], o["p90"], o["p99"], o["max"]) == (350, 597, 1_120, 2_000)
    ids = {f["id"] for f in shape["findings"]}
    assert {"timestamps.quantised", "prompt_tail.long", "output_tail.short"} <= ids
    # 60 s counts against numpy.
    t = mooncake["arrival"].dt.epoch("us").to_numpy()
    # Complete minutes of the observed span [first, last + the 3 s quantum).
    lo, hi = -(-t.min() // 60_000_000), (t.max() + 3_000_000) // 60_000_000 - 1
    b = t // 60_000_000
    counts = np.bincount(b[(b >= lo) & (b <= hi)] - lo)
    assert (w["60s"]["bins"], w["60s"]["peak_count"]) == (len(counts), counts.max())


def test_workload_facts_on_mooncake(mooncake: pl.DataFrame) -> None:
    settings = DEFAULTS.shape.replace(
        latency_model=DEFAULTS.shape.latency_model.replace(tpot_ms=20)
    )
    facts = compute_shape(mooncake.lazy(), settings).facts
    assert facts.requests == 12_031
    assert set(facts.peak_rate_rps) == {"60s"}  # 1 s and 10 s are not whole 3 s buckets
    assert facts.prompt_tokens.p99 == 85_401 and facts.output_tokens.p50 == 350
    assert facts.peak_concurrency_estimated and facts.latency_model is not None
    assert facts.latency_model.tpot_ms == 20
    assert facts.tenants is None and facts.models == () and facts.shared_prefix_ratio == {}
