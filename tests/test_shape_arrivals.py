"""Arrival metrics on small hand-computed traces: windows, dispersion, CV, quantisation, profile."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import conform
from pipeline.shape.arrivals import (
    ObservedSpan,
    arrival_metrics,
    arrival_series,
    detect_quantisation,
    observed_span,
    window_counts_stats,
)
from pipeline.shape.common import ShapeError
from pipeline.shape.compute import compute_shape
from pipeline.shape.result import WindowCounts
from tests.conftest import DEFAULTS

T0 = datetime(2024, 1, 1, tzinfo=UTC)  # an exact second, so epoch-aligned windows start here


def frame(offsets_s: list[float]) -> pl.LazyFrame:
    arrivals = [T0 + timedelta(microseconds=round(s * 1_000_000)) for s in offsets_s]
    return conform(pl.DataFrame({"arrival": arrivals, "prompt_tokens": [1] * len(arrivals)})).lazy()


def test_windows_and_gaps_hand_computed() -> None:
    m = arrival_metrics(frame([0.0, 0.5, 1.2, 1.2, 3.9]), min_quanta=3)
    assert m["requests"] == 5
    assert m["span_s"] == pytest.approx(3.9)
    assert m["mean_rate_rps"] == pytest.approx(5 / 3.9)
    w1 = m["windows"]["1s"]
    # Complete 1 s buckets inside [0, 3.9]: [0,1) [1,2) [2,3) hold 2, 2, 0 requests; [3,4)
    # is cut at 3.9 s, so its one request is not a 1 s count.
    assert (w1["bins"], w1["peak_count"], w1["peak_rate_rps"]) == (3, 2, 2.0)
    assert w1["mean_count"] == pytest.approx(4 / 3)
    assert w1["variance"] == pytest.approx((4 + 4 + 0) / 3 - (4 / 3) ** 2)
    assert w1["index_of_dispersion"] == pytest.approx((8 / 3 - 16 / 9) / (4 / 3))
    assert w1["peak_window_start"] == T0.isoformat()  # earliest of the tied peaks
    w10 = m["windows"]["10s"]
    assert w10 == {
        "supported": False,
        "reason": "the trace holds 0 complete 10 s window(s) and needs >= 2 "
        "(a partial window's count is not a 10 s count)",
        "window_s": 10,
    }
    gaps = [0.5, 0.7, 0.0, 2.7]
    ia = m["inter_arrival"]
    assert ia["supported"] and ia["gaps"] == 4
    assert ia["mean_gap_s"] == pytest.approx(statistics.fmean(gaps))
    assert ia["cv"] == pytest.approx(statistics.pstdev(gaps) / statistics.fmean(gaps))
    assert ia["zero_gap_share"] == pytest.approx(0.25)
    assert ia["max_gap_s"] == pytest.approx(2.7)
    assert ia["max_gap_starts"] == (T0 + timedelta(seconds=1.2)).isoformat()
    assert not m["quantisation"]["quantised"]


def test_single_request() -> None:
    m = arrival_metrics(frame([7.25]), min_quanta=3)
    assert m["requests"] == 1 and m["span_s"] == 0.0 and m["mean_rate_rps"] is None
    assert not m["windows"]["1s"]["supported"]
    assert "holds 0 complete 1 s window(s)" in m["windows"]["1s"]["reason"]
    assert m["inter_arrival"] == {"supported": False, "reason": "fewer than 2 requests"}
    assert m["hour_of_day"]["supported"] is False
    assert "holds 0 complete UTC day(s)" in m["hour_of_day"]["reason"]


def test_all_at_one_instant() -> None:
    m = arrival_metrics(frame([2.0, 2.0, 2.0]), min_quanta=3)
    assert m["mean_rate_rps"] is None
    assert not m["windows"]["1s"]["supported"]
    assert not m["inter_arrival"]["supported"]
    assert "same instant" in m["inter_arrival"]["reason"]


def test_empty_table_and_null_arrival_raise() -> None:
    with pytest.raises(ShapeError, match="empty"):
        arrival_metrics(conform(pl.DataFrame({"prompt_tokens": []})).lazy(), 3)
    bad = conform(pl.DataFrame({"arrival": [T0, None], "prompt_tokens": [1, 1]}))
    with pytest.raises(ShapeError, match="1 rows have a null 'arrival'"):
        arrival_metrics(bad.lazy(), 3)


def test_mooncake_like_buckets_are_detected() -> None:
    # 60 buckets ~3 s apart (jitter ±3 ms, like Mooncake), 5 requests each.
    rng = np.random.default_rng(1)
    bucket_ms = np.cumsum(np.r_[0, 3000 + rng.integers(-3, 4, 59)])
    offsets = np.repeat(bucket_ms, 5) / 1000
    m = arrival_metrics(frame(offsets.tolist()), min_quanta=3)
    q = m["quantisation"]
    assert q["quantised"] and q["distinct_timestamps"] == 60 and q["tie_share"] == 1.0
    assert q["quantum_s"] == pytest.approx(3.0, abs=0.004)
    assert not q["on_exact_grid"]
    assert m["windows"]["1s"]["supported"] is False
    assert "a 1 s window is not a whole number of buckets" in m["windows"]["1s"]["reason"]
    assert "peak_rate_rps" not in m["windows"]["1s"]
    assert not m["windows"]["10s"]["supported"]  # 3.33 buckets: counts alias
    assert m["windows"]["60s"]["supported"]  # 20 whole buckets
    assert m["inter_arrival"]["supported"] is False
    assert "quantised" in m["inter_arrival"]["reason"]


def test_exact_integer_second_grid_keeps_1s_windows() -> None:
    # Integer-second timestamps with many ties: quantised at 1 s, but 1 s windows hold whole
    # buckets, so they stay supported (the exact-grid exemption).
    offsets = [float(s) for s in range(30) for _ in range(3)]
    m = arrival_metrics(frame(offsets), min_quanta=3)
    q = m["quantisation"]
    assert q["quantised"] and q["quantum_s"] == 1.0 and q["on_exact_grid"]
    assert m["windows"]["1s"]["supported"] and m["windows"]["1s"]["peak_count"] == 3
    assert not m["inter_arrival"]["supported"]


def test_batch_submissions_are_not_quantisation() -> None:
    # Pairs submitted together at irregular instants: many ties, but no regular grid.
    rng = np.random.default_rng(2)
    instants = np.cumsum(rng.exponential(1.7, 200))
    q = detect_quantisation(frame(np.repeat(instants, 2).tolist()))
    assert q.tie_share == 1.0
    assert q.grid_share is not None and q.grid_share < 0.9
    assert not q.quantised and q.quantum_s is None


def test_time_profile_counts_complete_days_only() -> None:
    # One request at ten past each hour of day 0, a second one in hour 5, and three more on
    # day 1 (partial: the last arrival is at 02:00:10) in hours 0 and 1: those would have
    # doubled hours 0 and 1 of a one-day profile, so they are not counted.
    day_0 = [h * 3600.0 + 10 for h in range(24)] + [5 * 3600.0 + 20]
    day_1 = [86_400 + 10.0, 86_400 + 3600 + 10.0, 86_400 + 7200 + 10.0]
    m = arrival_metrics(frame([0.0, *day_0, *day_1]), min_quanta=3)
    prof = m["hour_of_day"]
    assert prof["supported"] and prof["timezone"] == "UTC" and prof["complete_days"] == 1
    by_hour = {r["hour"]: r["requests"] for r in prof["profile"]}
    assert by_hour[0] == 2 and by_hour[5] == 2 and by_hour[1] == 1 and len(by_hour) == 24
    assert sum(r["share"] for r in prof["profile"]) == pytest.approx(1.0)
    assert prof["peak_to_trough"] == pytest.approx(2.0)
    assert m["day_of_week"] == {
        "supported": False,
        "reason": "the trace holds 1 complete UTC day(s) and needs seven complete UTC days "
        "(partial days would weigh their hours more)",
    }
    # Starting ten seconds into day 0, no day is complete.
    late = arrival_metrics(frame([*day_0, *day_1]), min_quanta=3)
    assert not late["hour_of_day"]["supported"]
    assert "holds 0 complete UTC day(s)" in late["hour_of_day"]["reason"]


def test_arrival_series_includes_empty_buckets_and_drops_partial_ones() -> None:
    # Observed [0.1, 45.0]: [0,10) starts before the first arrival and [40,50) ends after the
    # last, so the complete buckets are [10,20) .. [30,40).
    lf = frame([0.1, 0.2, 25.0, 26.0, 45.0])
    m = arrival_metrics(lf, min_quanta=3)
    s = arrival_series(lf, 10, observed_span(m["first"], m["last"], None))
    assert s["requests"].to_list() == [0, 2, 0]
    assert s["bucket_start"][0] == T0 + timedelta(seconds=10)


def poisson_trace(cut_s: float) -> pl.DataFrame:
    """A Poisson process at 2 requests/s logged with 3 s timestamps (floored), cut at ``cut_s``."""
    gaps = np.random.default_rng(7).exponential(0.5, 5_000)
    arrivals = np.cumsum(gaps)
    logged = np.floor(arrivals[arrivals < cut_s] / 3) * 3
    frame = conform(
        pl.DataFrame(
            {
                "arrival": [T0 + timedelta(seconds=float(s)) for s in logged],
                "prompt_tokens": [100] * len(logged),
                "output_tokens": [100] * len(logged),
            }
        )
    )
    return frame


def test_a_trace_cut_mid_minute_is_not_bursty() -> None:
    # Cut at 1,210 s the last clock minute holds 10 s of traffic; counted as a minute it read
    # as a lull and gave an index of dispersion of 4.6 and the bursty finding.
    whole, cut = (compute_shape(poisson_trace(s), DEFAULTS.shape) for s in (1200, 1210))
    minute = cut.metrics.arrivals.windows["60s"]
    assert isinstance(minute, WindowCounts)
    seconds = poisson_trace(1200)["arrival"].dt.epoch("s") - int(T0.timestamp())
    counts = np.bincount((seconds // 60).to_numpy())
    assert minute.bins == len(counts) == 20
    assert minute.index_of_dispersion == pytest.approx(counts.var() / counts.mean())
    assert minute.index_of_dispersion == pytest.approx(0.68, abs=0.01)
    assert minute == whole.metrics.arrivals.windows["60s"]
    assert "arrivals.bursty" not in [f.id for f in cut.metrics.findings]
    # The plotted series stops at the last complete bucket too.
    assert cut.plots.arrival_series.equals(whole.plots.arrival_series)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 200_000_000), min_size=1, max_size=60),
    st.sampled_from([1, 10, 60]),
)
def test_window_stats_match_numpy_reference(offsets_us: list[int], window: int) -> None:
    lf = frame([o / 1e6 for o in offsets_us])
    t = np.array(offsets_us, dtype=np.int64) + int(T0.timestamp()) * 1_000_000
    w_us = window * 1_000_000
    got = window_counts_stats(lf, window, ObservedSpan(int(t.min()), int(t.max())))
    # Complete windows: start at or after the first arrival, end at or before the last.
    lo, hi = -(-t.min() // w_us), t.max() // w_us - 1
    b = t // w_us
    counts = np.bincount(b[(b >= lo) & (b <= hi)] - lo, minlength=max(hi - lo + 1, 0))
    if len(counts) < 2:
        assert isinstance(got, str) and f"holds {len(counts)} complete" in got
        return
    assert isinstance(got, dict)
    assert got["bins"] == len(counts)
    assert got["peak_count"] == counts.max()
    assert got["mean_count"] == pytest.approx(counts.mean())
    if counts.sum() == 0:
        assert got["index_of_dispersion"] is None
    else:
        assert got["index_of_dispersion"] == pytest.approx(counts.var() / counts.mean(), abs=1e-9)
