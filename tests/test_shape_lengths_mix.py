"""Token percentiles, sessions, tenants/models, features and provider-cache share, by hand."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import conform
from pipeline.shape.common import distribution
from pipeline.shape.lengths import length_metrics
from pipeline.shape.mix import (
    category_metrics,
    feature_metrics,
    provider_cache_metrics,
    session_metrics,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def nearest_reference(values: list[int], q: float) -> float:
    """The documented method, written out: sorted value at index floor((n-1)*q + 0.5)."""
    s = sorted(values)
    return float(s[math.floor((len(s) - 1) * q + 0.5)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=300))
def test_percentiles_match_reference(values: list[int]) -> None:
    lf = pl.DataFrame({"x": values}).lazy()
    d = distribution(lf, "x")
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)):
        assert d[name] == nearest_reference(values, q), name
    assert d["max"] == max(values) and d["min"] == min(values) and d["count"] == len(values)


def test_percentiles_hand_computed_and_ties_round_up() -> None:
    # n = 2: (n-1)*0.5 = 0.5 rounds up to index 1 (numpy's "nearest" would round to even: 10).
    d = distribution(pl.DataFrame({"x": [10, 30]}).lazy(), "x")
    assert (d["p50"], d["p99"], d["p99_over_p50"]) == (30.0, 30.0, 1.0)
    d = distribution(pl.DataFrame({"x": list(range(1, 101))}).lazy(), "x")
    # index floor(99*q + 0.5): p50 -> 50 (value 51), p90 -> 89 (90), p95 -> 94 (95), p99 -> 98 (99)
    assert (d["p50"], d["p90"], d["p95"], d["p99"], d["max"]) == (51, 90, 95, 99, 100)
    assert d["p99_over_p50"] == pytest.approx(99 / 51)


def test_zero_length_output_and_unlogged_output() -> None:
    df = conform(
        pl.DataFrame(
            {"arrival": [T0] * 4, "prompt_tokens": [5, 5, 5, 5], "output_tokens": [0, 0, 0, 8]}
        )
    )
    m = length_metrics(df.lazy())
    out = m["output_tokens"]
    assert (out["p50"], out["p99"], out["max"], out["count"]) == (0.0, 8.0, 8.0, 4)
    assert out["p99_over_p50"] is None  # p99/p50 = 8/0 is infinite: written as null
    unlogged = conform(pl.DataFrame({"arrival": [T0], "prompt_tokens": [5]}))
    m = length_metrics(unlogged.lazy())
    assert m["output_tokens"]["count"] == 0 and m["output_tokens"]["p50"] is None
    assert m["output_tokens"]["logged"] is False


def test_long_context_shares() -> None:
    df = conform(pl.DataFrame({"arrival": [T0] * 4, "prompt_tokens": [10, 8192, 40_000, 200_000]}))
    lc = length_metrics(df.lazy())["long_context"]
    assert lc[">=8192"] == {"requests": 3, "share": 0.75}
    assert lc[">=32768"]["requests"] == 2 and lc[">=131072"]["requests"] == 1


def sessions_frame() -> pl.DataFrame:
    # Session a: 3 turns at 0 s, 10 s, 25 s with prompts 100, 250, 200 (a compaction).
    # Session b: 1 turn. One row without a session.
    return conform(
        pl.DataFrame(
            {
                "request_id": ["a2", "a0", "b0", "a1", "x"],
                "arrival": [T0 + timedelta(seconds=s) for s in (25, 0, 3, 10, 4)],
                "session_id": ["a", "a", "b", "a", None],
                "turn": [2, 0, 0, 1, None],
                "prompt_tokens": [200, 100, 50, 250, 7],
            }
        )
    )


def test_sessions_hand_computed() -> None:
    s = session_metrics(sessions_frame().lazy())
    assert s["known"] and s["sessions"] == 2 and s["rows_with_session"] == 4
    assert s["multi_turn_sessions"] == 1
    turns = s["turns_per_session"]
    assert (turns["p50"], turns["p99"], turns["max"]) == (3.0, 3.0, 3.0)  # [1, 3]: index 0.5→1
    gaps = s["inter_turn_gap_s"]
    assert gaps["count"] == 2 and (gaps["min"], gaps["max"]) == (10.0, 15.0)
    growth = s["history_growth_tokens"]
    assert (growth["min"], growth["max"], growth["negative_steps"]) == (-50.0, 150.0, 1)


def test_no_sessions() -> None:
    df = conform(pl.DataFrame({"arrival": [T0], "prompt_tokens": [1]}))
    assert session_metrics(df.lazy()) == {"known": False, "reason": "no session_id logged"}


def test_tenants_models_features_cache() -> None:
    df = conform(
        pl.DataFrame(
            {
                "arrival": [T0] * 5,
                "prompt_tokens": [100, 100, 200, 50, 50],
                "tenant": ["t1", "t2", "t1", None, "t1"],
                "model": ["m"] * 5,
                "structured_output": [True, False, None, None, True],
                "tools": [None] * 5,
                "lora_adapter": ["ad1", None, "ad2", "ad1", None],
                "cached_tokens": [50, None, 100, 0, None],
            }
        )
    )
    t = category_metrics(df.lazy(), "tenant")
    assert t["distinct"] == 2 and t["requests_unlogged"] == 1
    assert t["top"] == [
        {"value": "t1", "requests": 3, "share": 0.6},
        {"value": "t2", "requests": 1, "share": 0.2},
    ]
    assert category_metrics(df.lazy(), "model")["top"] == [
        {"value": "m", "requests": 5, "share": 1.0}
    ]
    f = feature_metrics(df.lazy())
    assert f["structured_output"] == {"logged_rows": 3, "requests": 2, "share_of_logged": 2 / 3}
    assert f["tools"] == {"logged_rows": 0, "requests": 0, "share_of_logged": None}
    assert f["lora_adapter"] == {"requests": 3, "distinct_adapters": 2, "share": 0.6}
    c = provider_cache_metrics(df.lazy())
    # logged rows: prompts 100 + 200 + 50 = 350; cached 50 + 100 + 0 = 150
    assert c == {
        "logged": True,
        "rows_logged": 3,
        "cached_tokens": 150,
        "prompt_tokens": 350,
        "cached_share": 150 / 350,
    }
    empty = conform(pl.DataFrame({"arrival": [T0], "prompt_tokens": [1]}))
    assert provider_cache_metrics(empty.lazy())["logged"] is False


def test_percentiles_against_numpy_on_skewed_data() -> None:
    values = np.random.default_rng(3).lognormal(6, 1.5, 5001).astype(np.int64)
    d = distribution(pl.DataFrame({"x": values}).lazy(), "x")
    # With n = 5001, (n-1)*q is an integer for every q, so numpy's methods all agree.
    for name, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert d[name] == np.percentile(values, q, method="nearest")
