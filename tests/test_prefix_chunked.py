"""Prefix and session statistics per chunk, merged: chunked session inference (by UTC day or
by small slices) gives what one pass gives, carrying only what is open at a boundary when an
inactivity gap closes conversations; the state budget and the curve's hash budget fall back to
counted or stated approximations."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.prefix.analysis import session_stats, session_stats_of
from pipeline.prefix.compute import DEFAULT_CURVE_HASH_BUDGET, CurveCounter
from pipeline.prefix.sessions import (
    DEFAULT_SESSION_STATE_BUDGET,
    SessionStream,
    flat_lists,
    infer_sessions,
    infer_sessions_chunked,
    utc_days,
)
from pipeline.settings import default_mapping
from tests.prefix_oracles import infer_parents

GAP_S = 3_600.0


@pytest.fixture(scope="module")
def trace() -> pl.DataFrame:
    """~2 days of generated conversations (think times of an hour, so many span midnight);
    every third conversation logs its id (half of those their turns too), one of them as the
    literal "inferred-2"."""
    drawn = conversations(spec(4_000, "short", seed=5, rate_rps=0.03, think_s=2_400.0))
    frame = canonical_frame(drawn, 16, sessions=True)
    conv = frame["session_id"].cast(pl.Int64)
    logged = (conv % 3) == 0
    return frame.with_columns(
        pl.when(logged)
        .then(pl.when(conv == 3).then(pl.lit("inferred-2")).otherwise("s" + pl.col("session_id")))
        .alias("session_id"),
        pl.when(logged & (conv % 2 == 0)).then(pl.col("turn")).alias("turn"),
    )


def _slices(frame: pl.DataFrame, rows: int) -> list[pl.DataFrame]:
    return [frame.slice(i, rows) for i in range(0, frame.height, rows)]


def test_the_trace_spans_midnight(trace: pl.DataFrame) -> None:
    days = trace.group_by(pl.col("arrival").dt.date()).len()
    assert days.height >= 2
    one = infer_sessions(trace).with_columns(trace["arrival"].dt.date().alias("day"))
    spanning = one.group_by("session_id").agg(pl.col("day").n_unique() > 1)
    assert spanning["day"].sum() >= 3  # conversations carried across a day boundary


@pytest.mark.parametrize("chunking", ["days", "slices", "whole"])
def test_chunked_equals_one_pass(trace: pl.DataFrame, chunking: str) -> None:
    chunks = {
        "days": lambda: list(utc_days(trace)),
        "slices": lambda: _slices(trace, 211),
        "whole": lambda: [trace],
    }[chunking]()
    one = infer_sessions(trace)
    got, totals = infer_sessions_chunked(chunks)
    assert_frame_equal(got, one)
    assert totals.closed_early == 0 and totals.reopened == 0
    assert session_stats_of(
        totals.turns, totals.requests, totals.inferred_requests, 2
    ) == session_stats(one, 2)
    # against the whole-table parent search: an unlogged request joins its parent's session,
    # and one without a parent starts a session of its own
    parent = infer_parents(trace).to_numpy()
    ids = got["session_id"].to_numpy()
    unlogged = trace["session_id"].is_null().to_numpy()
    has = unlogged & ~np.isnan(parent)
    assert has.sum() > 1000
    assert (ids[has] == ids[parent[has].astype(np.int64)]).all()
    starts = unlogged & np.isnan(parent)
    assert len(set(ids[starts])) == int(starts.sum())
    # the literal id names the same session as inferred conversation 2
    assert one.filter(pl.col("session_id") == "inferred-2")["session_inferred"].n_unique() == 2


def _open_at_boundaries(trace: pl.DataFrame, found: pl.DataFrame, rows: int) -> int:
    """Most (requests within the gap before a boundary + sessions open across it) over the
    boundaries of ``rows``-row slices: what the carried state may hold."""
    us = trace["arrival"].dt.epoch("us").to_numpy()
    spans = (
        found.with_columns(pl.Series("us", us))
        .group_by("session_id")
        .agg(pl.col("us").min().alias("first"), pl.col("us").max().alias("last"))
    )
    gap = int(GAP_S * 1e6)
    worst = 0
    for stop in range(rows, trace.height, rows):
        t = int(us[stop - 1])
        recent = int(np.count_nonzero(us[:stop] >= t - gap))
        logged = trace["session_id"][:stop].drop_nulls().n_unique()
        live = spans.filter((pl.col("first") <= t) & (pl.col("last") >= t - gap)).height
        worst = max(worst, recent + live + logged)
    return worst


def test_a_gap_bounds_the_carried_state(trace: pl.DataFrame) -> None:
    whole, _ = infer_sessions_chunked([trace], SessionStream(gap_s=GAP_S))
    got, totals = infer_sessions_chunked(_slices(trace, 211), SessionStream(gap_s=GAP_S))
    assert_frame_equal(got, whole)
    assert session_stats_of(totals.turns, totals.requests, totals.inferred_requests, 2) == (
        session_stats(whole, 2)
    )
    # without a gap everything registered stays; with it, what is open at a boundary
    _, unbounded = infer_sessions_chunked(_slices(trace, 211))
    assert totals.carried_max <= _open_at_boundaries(trace, got, 211)
    assert totals.carried_max * 3 < unbounded.carried_max
    # a continuation never reaches further back than the gap
    us = trace["arrival"].dt.epoch("us").to_numpy()
    inferred = got.with_columns(pl.Series("us", us)).filter(
        pl.col("session_inferred") & ~pl.col("session_id").is_in(["inferred-2"])
    )
    steps = inferred.group_by("session_id").agg(pl.col("us").diff().max().alias("step"))
    assert int(steps["step"].max()) <= GAP_S * 1e6  # type: ignore[arg-type]


def test_the_budget_closes_sessions_early_and_says_so(trace: pl.DataFrame) -> None:
    one = infer_sessions(trace)
    got, totals = infer_sessions_chunked(_slices(trace, 211), SessionStream(budget=400))
    assert totals.closed_early > 0
    assert totals.carried_max <= 400
    assert got["request_id"].to_list() == one["request_id"].to_list()
    assert got["session_id"].n_unique() >= one["session_id"].n_unique()
    assert (
        session_stats_of(totals.turns, totals.requests, totals.inferred_requests, 2)["requests"]
        == trace.height
    )


def _curve(trace: pl.DataFrame, budget: int) -> tuple[pl.DataFrame, CurveCounter]:
    known = trace["hashes_known"].to_numpy().astype(np.bool_)
    blocks = trace["prompt_blocks"].to_numpy().astype(np.int64)
    tokens = trace["prompt_tokens"].cast(pl.Int64).to_numpy()
    reach = np.unique(blocks[known], return_counts=True)
    counter = CurveCounter(16, int(tokens.max()), reach, budget)
    for part in _slices(trace, 500):
        flat = flat_lists(part["prefix_hashes"])
        counter.feed(
            flat.offsets,
            flat.values,
            flat.nulls,
            part["hashes_known"].to_numpy().astype(np.bool_),
            part["prompt_blocks"].to_numpy().astype(np.int32),
            part["prompt_tokens"].cast(pl.Int64).to_numpy(),
        )
    return counter.finish(), counter


def test_the_curve_estimate_is_within_its_standard_error(trace: pl.DataFrame) -> None:
    exact, exact_counter = _curve(trace, DEFAULT_CURVE_HASH_BUDGET)
    assert exact_counter.rate == 1.0
    # one hash over the budget: budget / (8 x hashes) is just under 1/8, the nearest power of two
    estimate, counter = _curve(trace, exact_counter.hashes - 1)
    assert counter.rate == 1 / 8
    assert_frame_equal(
        estimate.drop(
            "sharing",
            "share",
            "share_eligible",
            "prompt_tokens_sharing",
            "token_share",
            "token_share_eligible",
        ),
        exact.drop(
            "sharing",
            "share",
            "share_eligible",
            "prompt_tokens_sharing",
            "token_share",
            "token_share_eligible",
        ),
    )
    # the standard error of the ratio estimate from every class (an independent reference):
    # √((1 − rate)/rate · Σ c² (s_c − ρ)²), s_c = 1 when c ≥ 2, ρ the exact share
    true_errors = []
    for k in exact["window_blocks"]:
        sizes = (
            trace.filter(pl.col("prompt_blocks") >= k)
            .group_by(pl.col("prefix_hashes").list.get(k - 1))
            .len()["len"]
            .to_numpy()
            .astype(np.float64)
        )
        rho = sizes[sizes >= 2].sum() / sizes.sum()
        spread = np.sum(sizes**2 * ((sizes >= 2) - rho) ** 2)
        true_errors.append(math.sqrt((1 - counter.rate) / counter.rate * spread))
    diff = np.abs(estimate["sharing"].to_numpy() - exact["sharing"].to_numpy())
    assert (diff <= 3 * np.array(true_errors) + 1).all(), (diff, true_errors)
    assert max(true_errors) > 10  # a real estimate, not the exact answer by luck
    # the stated error tracks the true one where it is not zero
    stated = np.array(counter.standard_errors)
    live = np.array(true_errors) > 5
    assert (stated[live] > np.array(true_errors)[live] / 3).all(), (stated, true_errors)
    assert (stated[live] < np.array(true_errors)[live] * 3).all(), (stated, true_errors)
    # windows everyone shares are exact (every kept class shares)
    assert (diff[:3] == 0).all()


def test_defaults_keep_the_documented_budgets() -> None:
    prefix = default_mapping()["prefix"]
    assert prefix["session_state_budget"] == DEFAULT_SESSION_STATE_BUDGET
    assert prefix["curve_hash_budget"] == DEFAULT_CURVE_HASH_BUDGET
    assert prefix["session_gap_s"] is None
