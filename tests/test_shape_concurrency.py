"""Peak concurrency: tie order, zero-length requests, estimates, and a naive sweep reference."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import conform
from pipeline.shape.common import ShapeError
from pipeline.shape.concurrency import peak_concurrency
from pipeline.shape.facts import LatencyModel
from tests.conftest import DEFAULTS

T0 = datetime(2024, 1, 1, tzinfo=UTC)
LM = DEFAULTS.shape.latency


def frame(
    starts_ms: list[int], e2e_ms: list[float | None], outputs: list[int] | None = None
) -> pl.DataFrame:
    n = len(starts_ms)
    return conform(
        pl.DataFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "arrival": [T0 + timedelta(milliseconds=s) for s in starts_ms],
                "e2e_ms": pl.Series(e2e_ms, dtype=pl.Float64),
                "prompt_tokens": [100] * n,
                "output_tokens": outputs if outputs is not None else [10] * n,
                "source_file": ["t.jsonl"] * n,
                "source_line": list(range(1, n + 1)),
            }
        )
    )


def reference_sweep(intervals: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    """Naive +1/-1 sweep: events sorted by (time, delta) so an end (-1) precedes a start (+1)."""
    events = sorted([(s, +1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level, peak, steps = 0, 0, []
    for i, (t, delta) in enumerate(events):
        level += delta
        if i + 1 == len(events) or events[i + 1][0] != t:
            steps.append((t, level))
            peak = max(peak, level)
    return peak, steps


def test_back_to_back_requests_do_not_overlap() -> None:
    r = peak_concurrency(frame([0, 1000, 2000], [1000.0, 1000.0, 1000.0]), LM)
    assert r.peak == 1 and not r.estimated and r.durations_logged == 3
    assert r.mean == pytest.approx(1.0)
    assert r.as_dict()["tie_order"].startswith("end before start")


def test_overlap_and_peak_time() -> None:
    r = peak_concurrency(frame([0, 500, 900, 5000], [1000.0, 1000.0, 50.0, 10.0]), LM)
    # [0,1000) [500,1500) [900,950) [5000,5010): three overlap at 900 ms.
    assert r.peak == 3 and r.peak_at == T0 + timedelta(milliseconds=900)


def test_zero_length_requests_occupy_nothing() -> None:
    r = peak_concurrency(frame([0, 0, 0], [0.0, 0.0, 1.0]), LM)
    assert r.peak == 1
    r = peak_concurrency(frame([0], [0.0]), LM)
    assert r.peak == 0 and r.peak_at is None and r.mean is None


def test_single_request() -> None:
    r = peak_concurrency(frame([0], [250.0]), LM)
    assert r.peak == 1 and r.mean == pytest.approx(1.0)


def test_estimated_durations_are_labelled_with_the_model() -> None:
    lm = LatencyModel(ttft_base_ms=100, ttft_per_prompt_token_ms=1.0, tpot_ms=10)
    # prompt 100 -> ttft 200 ms; outputs 0 and 30 -> 200 ms and 500 ms; null output counts as 0.
    df = frame([0, 150, 400], [None, None, None], outputs=[0, 30, None])  # type: ignore[list-item]
    r = peak_concurrency(df, lm)
    # [0,200) [150,650) [400,600): peak 2 (at 150 and at 400).
    assert r.peak == 2 and r.peak_at == T0 + timedelta(milliseconds=150)
    assert r.estimated and r.durations_estimated == 3 and r.latency_model == lm
    d = r.as_dict()
    assert d["latency_model"] == lm.as_dict() and d["label"].startswith("estimated")
    assert "100 ms + 1 ms/prompt token + 10 ms/output token" in d["label"]
    assert r.series["estimated"].all()


def test_mixed_logged_and_estimated() -> None:
    r = peak_concurrency(frame([0, 10], [5.0, None]), LM)
    assert r.estimated and (r.durations_logged, r.durations_estimated) == (1, 1)


def test_negative_duration_names_the_record() -> None:
    with pytest.raises(ShapeError, match=r"t\.jsonl:2: request 'r1' has e2e_ms=-3\.0"):
        peak_concurrency(frame([0, 10], [5.0, -3.0]), LM)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 3_000)), min_size=1, max_size=40),
    st.integers(10, 50),
)
def test_matches_naive_sweep(reqs: list[tuple[int, int]], points: int) -> None:
    starts = [s for s, _ in reqs]
    durations = [float(d) for _, d in reqs]
    df = frame(starts, durations)  # type: ignore[arg-type]
    base = int(T0.timestamp() * 1_000_000)
    intervals = [(base + s * 1000, base + (s + d) * 1000) for s, d in reqs]
    peak, steps = reference_sweep(intervals)
    r = peak_concurrency(df, LM, max_points=points)
    assert r.peak == peak

    # Each bucket's max/min equal those of the step function over [bucket start, next start).
    def level_at(t: int) -> int:
        before = [c for ts, c in steps if ts <= t]
        return before[-1] if before else 0

    width = round(r.series["bucket_s"][0] * 1_000_000)
    for b, hi, lo in r.series.select(
        pl.col("bucket_start").dt.epoch("us"), "concurrency_max", "concurrency_min"
    ).iter_rows():
        inside = [level_at(b)] + [c for ts, c in steps if b < ts < b + width]
        assert (hi, lo) == (max(inside), min(inside))
    assert r.series["concurrency_max"].max() == peak
    assert r.series["concurrency_min"].min() == 0
    assert r.series.height <= points + 1
    assert r.mean == pytest.approx(
        sum(durations) / (max(s + d for s, d in reqs) - min(starts))
        if max(s + d for s, d in reqs) > min(starts)
        else None
    )
