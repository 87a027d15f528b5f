"""The shape stage above its exact limit (forced with a tiny ``exact_max_requests``): on
generated multi-day workloads the chunked, sketched result has the exact result's counts and
sums, percentiles within the sketch's stated error, the same concurrency sweep, the same plots'
data and the same verdicts; the exact path writes nothing new."""

from __future__ import annotations

import math
from functools import cache
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.config import default_config
from pipeline.report.sections.content import ReportContent
from pipeline.report.sections.shape import shape
from pipeline.shape.common import ShapeError
from pipeline.shape.compute import compute_shape
from pipeline.shape.concurrency import peak_concurrency
from pipeline.shape.result import ShapeResult
from pipeline.shape.sketch import RELATIVE_ERROR

CFG = default_config().shape
PERCENTILES = {"p50", "p90", "p95", "p99"}
# Sums of floats in another order: the same figure to the last digits.
FLOAT_SUMS = {"mean", "std_gap_s", "cv", "inter_arrival_cv", "mean_concurrency"}


@cache
def _workloads() -> dict[str, pl.DataFrame]:
    """Eight days of conversations (sessions, tenants, models, a daily cycle), and a
    quantised, busier trace whose ties straddle chunk boundaries, half its durations logged."""
    days = canonical_frame(
        conversations(
            spec(20_000, "long", seed=3, rate_rps=0.03, diurnal=0.5, tenants=3, models=2)
        ),
        None,
        sessions=True,
    )
    busy = canonical_frame(conversations(spec(6_000, "short", seed=4, rate_rps=20.0)), None)
    rng = np.random.default_rng(9)
    e2e = np.where(rng.random(busy.height) < 0.5, rng.exponential(4000.0, busy.height), np.nan)
    busy = busy.with_columns(
        pl.col("arrival").dt.truncate("1s"), pl.Series("e2e_ms", e2e).fill_nan(None)
    )
    return {"days": days, "quantised": busy}


@cache
def _results(name: str) -> tuple[ShapeResult, ShapeResult]:
    frame = _workloads()[name]
    exact = compute_shape(frame, CFG)
    chunked = compute_shape(frame, CFG, exact_max_requests=100, chunk_rows=2_477)
    return exact, chunked


def _compare(exact: Any, sketched: Any, path: str = "") -> None:
    """Every figure equal, but percentiles (within the sketch's error), ratios of two of them,
    float sums and the finding messages that print them."""
    key = path.rsplit(".", 1)[-1]
    if isinstance(exact, dict):
        assert set(exact) == set(sketched), path
        for k in exact:
            _compare(exact[k], sketched[k], f"{path}.{k}")
    elif isinstance(exact, list):
        assert len(exact) == len(sketched), path
        for i, (a, b) in enumerate(zip(exact, sketched, strict=True)):
            _compare(a, b, f"{path}[{i}]")
    elif key in PERCENTILES and exact is not None:
        assert abs(sketched - exact) <= RELATIVE_ERROR * abs(exact) * (1 + 1e-12), path
    elif key in ("p99_over_p50", "threshold_ratio") and exact is not None:
        bound = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
        assert exact / bound <= sketched <= exact * bound * (1 + 1e-12), path
    elif key in FLOAT_SUMS and exact is not None:
        assert sketched == pytest.approx(exact, rel=1e-12), path
    elif key == "message":
        return
    else:
        assert exact == sketched, path


@pytest.mark.parametrize("name", ["days", "quantised"])
def test_chunked_figures_equal_the_exact_ones_but_sketched_percentiles(name: str) -> None:
    exact, chunked = _results(name)
    a, b = exact.to_json(), chunked.to_json()
    assert "percentiles_sketched" not in a
    assert b.pop("percentiles_sketched") == {
        "relative_error": RELATIVE_ERROR,
        "method": "DDSketch log-spaced buckets merged across chunks (Masson et al., PVLDB 2019)",
        "requests": exact.metrics.requests,
        "exact_max_requests": 100,
    }
    assert "sketched" in b.pop("percentile_method") and "sketched" not in a.pop("percentile_method")
    _compare(a, b)
    # The chunks really split runs of equal timestamps and sessions.
    if name == "quantised":
        assert a["arrivals"]["quantisation"]["quantised"] and a["concurrency"]["estimated"]
        assert a["arrivals"]["quantisation"]["distinct_timestamps"] < exact.metrics.requests
    else:
        assert a["sessions"]["sessions"] > 1000 and a["arrivals"]["day_of_week"]["supported"]
        assert a["lengths"]["prompt_tokens"]["p50"] != b["lengths"]["prompt_tokens"]["p50"]


@pytest.mark.parametrize("name", ["days", "quantised"])
def test_verdicts_facts_and_plots_are_unchanged(name: str) -> None:
    exact, chunked = _results(name)
    verdict = [(f.axis, f.id, f.estimated) for f in exact.findings]
    assert verdict == [(f.axis, f.id, f.estimated) for f in chunked.findings]
    fa, fb = exact.facts.as_dict(), chunked.facts.as_dict()
    for key in ("prompt_tokens", "output_tokens"):
        for q, value in fa.pop(key).items():
            got = fb[key][q]
            assert abs(got - value) <= RELATIVE_ERROR * value * (1 + 1e-12), (key, q)
        fb.pop(key)
    assert fa == fb
    assert_frame_equal(exact.concurrency_series, chunked.concurrency_series)
    assert exact.plots is not None and chunked.plots is not None
    assert_frame_equal(exact.plots.arrival_series, chunked.plots.arrival_series)
    for curve in ("prompt", "output"):
        assert_frame_equal(exact.plots.length_cdfs[curve], chunked.plots.length_cdfs[curve])


def test_the_sketch_note_survives_the_round_trip() -> None:
    _, chunked = _results("days")
    again = ShapeResult.from_json(chunked.to_json())
    assert again.to_json() == chunked.to_json()
    assert again.metrics.percentiles_sketched is not None
    assert again.metrics.percentiles_sketched.relative_error == RELATIVE_ERROR


def test_sweep_carries_requests_across_every_boundary() -> None:
    """One request per chunk, ties across boundaries, durations spanning many chunks: the
    chunked sweep's peak, its time and envelope equal the whole-table sweep's."""
    rng = np.random.default_rng(1)
    n = 240
    arrival = np.sort(rng.integers(0, 86_400 * 10**6, n))
    arrival[100:110] = arrival[100]
    e2e = np.where(rng.random(n) < 0.5, rng.exponential(2e7, n), np.nan)
    frame = pl.DataFrame(
        {
            "arrival": pl.Series(arrival).cast(pl.Datetime("us", "UTC")),
            "e2e_ms": pl.Series(e2e).fill_nan(None),
            "prompt_tokens": rng.integers(1, 5000, n),
            "output_tokens": rng.integers(1, 500, n),
            "request_id": [str(i) for i in range(n)],
            "source_file": "x",
            "source_line": np.arange(n),
        }
    )
    whole = peak_concurrency(frame, CFG.latency, 50)
    assert whole.peak > 10
    for rows in (1, 9):
        part = peak_concurrency(frame, CFG.latency, 50, exact_max_requests=0, chunk_rows=rows)
        assert (part.peak, part.peak_at, part.durations_logged, part.durations_estimated) == (
            whole.peak,
            whole.peak_at,
            whole.durations_logged,
            whole.durations_estimated,
        )
        assert part.mean is not None and whole.mean is not None
        assert math.isclose(part.mean, whole.mean, rel_tol=1e-12)
        assert_frame_equal(part.series, whole.series)


def test_the_chunked_path_refuses_an_unsorted_table() -> None:
    frame = _workloads()["quantised"].reverse()
    with pytest.raises(ShapeError, match="not sorted"):
        compute_shape(frame, CFG, exact_max_requests=100, chunk_rows=2_477)


def test_the_report_says_so_only_when_sketched() -> None:
    exact, chunked = _results("quantised")
    facts = {}
    for name, result in (("exact", exact), ("sketched", chunked)):
        inputs = SimpleNamespace(shape=result.metrics, figures={})
        facts[name] = {f.label: f.value for f in shape(cast(ReportContent, inputs)).facts}
    assert "Percentiles" not in facts["exact"]
    assert facts["sketched"].pop("Percentiles") == (
        "sketched (more than 100 requests): each within 0.1% of the exact value "
        "(DDSketch, Masson et al. 2019)"
    )
    assert facts["sketched"].keys() == facts["exact"].keys()


def test_the_chunked_path_names_null_arrivals_first() -> None:
    frame = _workloads()["quantised"].with_columns(
        pl.when(pl.int_range(pl.len()) == 3000)
        .then(None)
        .otherwise(pl.col("arrival"))
        .alias("arrival")
    )
    with pytest.raises(ShapeError, match="1 rows have a null 'arrival'"):
        compute_shape(frame, CFG, exact_max_requests=100, chunk_rows=2_477)
