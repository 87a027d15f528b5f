"""Pure predicates over a prefix result; each returns the list of problems (empty = pass)."""

from __future__ import annotations

import polars as pl

from pipeline.spill import hash_groups

# Rows of sessions.parquet read at once, and about the rows of a group of sessions checked
# together (a few hundred MB of aggregation state).
CHECK_ROWS = 4_000_000


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
    # per-session aggregates, a group of sessions at a time (by a hash of the id), so memory
    # follows a group, not the 25M sessions of 100M requests
    turn = pl.col("turn")
    columns = ("session_id", "session_inferred", "turn")
    slices = [lazy.select(columns).slice(at, CHECK_ROWS) for at in range(0, rows, CHECK_ROWS)]
    found = []
    with hash_groups(slices, "session_id", max(1, -(-rows // CHECK_ROWS))) as groups:
        for group in groups if slices else []:
            found.append(
                group.group_by("session_id")
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
                .select("session_id")
                .collect(engine="streaming")
            )
    bad = pl.concat(found) if found else pl.DataFrame(schema={"session_id": pl.String})
    if bad.height:
        problems.append(
            f"sessions: {bad.height} inferred sessions whose turns are not 0..n-1 "
            f"(e.g. {bad['session_id'].sort().head(3).to_list()})"
        )
    return problems
