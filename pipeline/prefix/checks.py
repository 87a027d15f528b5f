"""Pure predicates over a prefix result; each returns the list of problems (empty = pass)."""

from __future__ import annotations

import polars as pl


def sessions_consistent(sessions: pl.LazyFrame | pl.DataFrame, n_requests: int) -> list[str]:
    """One row per request, ids never null, and in every session whose ids were all inferred
    the turns are exactly 0 .. n-1 (a query is read for these alone)."""
    problems = []
    lazy = sessions.lazy()
    rows, nulls = (
        lazy.select(pl.len(), pl.col("session_id").null_count()).collect(engine="streaming").row(0)
    )
    if rows != n_requests:
        problems.append(f"sessions: {rows} rows for {n_requests} requests")
    if nulls:
        problems.append(f"sessions: {nulls} rows without a session_id")
    # n turns are 0..n-1 exactly when they are n distinct values from 0 to n-1, none null:
    # per-session aggregates, no sort of each session's turns (the table of 25M sessions
    # still takes 8.6 GiB at 100M requests: README, the check's own pass is left for later)
    turn = pl.col("turn")
    bad = (
        lazy.select("session_id", "session_inferred", "turn")
        .group_by("session_id")
        .agg(
            pl.col("session_inferred").all().alias("inferred"),
            (
                (turn.null_count() == 0)
                & (turn.min() == 0)
                & (turn.max() == pl.len() - 1)
                & (turn.n_unique() == pl.len())
            )
            .fill_null(False)
            .alias("dense"),
        )
        .filter(pl.col("inferred") & ~pl.col("dense"))
        .collect(engine="streaming")
    )
    if bad.height:
        problems.append(
            f"sessions: {bad.height} inferred sessions whose turns are not 0..n-1 "
            f"(e.g. {bad['session_id'].sort().head(3).to_list()})"
        )
    return problems
