"""The prefix stage's files: names, the writer, and a consistency predicate for the asset check.

Files under ``<workload dir>/prefix/``:

``prefix_sharing.json``
    The summary (keys documented in ``docs/prefix.md``).
``curve.parquet``
    One row per window: :data:`pipeline.prefix.compute.CURVE_SCHEMA`.
``sessions.parquet``
    ``request_id, session_id, session_inferred, turn`` in arrival order.
``curve.svg``
    The sharing curve (deterministic SVG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from pipeline.prefix.report import PrefixAnalysis
from pipeline.store import write_bytes_atomic, write_json_atomic, write_parquet_atomic

STAGE = "prefix"
SUMMARY_FILE = "prefix_sharing.json"
CURVE_FILE = "curve.parquet"
SESSIONS_FILE = "sessions.parquet"
SVG_FILE = "curve.svg"


def write_prefix_outputs(result: PrefixAnalysis, out_dir: Path, svg: bytes) -> dict[str, Path]:
    """Write the four files atomically; returns their paths by kind."""
    paths = {
        "summary": out_dir / SUMMARY_FILE,
        "curve": out_dir / CURVE_FILE,
        "sessions": out_dir / SESSIONS_FILE,
        "plot": out_dir / SVG_FILE,
    }
    write_json_atomic(paths["summary"], result.summary)
    write_parquet_atomic(result.curve, paths["curve"])
    write_parquet_atomic(result.sessions, paths["sessions"])
    write_bytes_atomic(paths["plot"], svg)
    return paths


def sessions_consistent(requests: pl.LazyFrame, sessions_path: Path) -> list[str]:
    """Problems with ``sessions.parquet``: one row per request, ids never null, and in every
    session whose ids were all inferred the turns are exactly 0 .. n-1."""
    if not sessions_path.is_file():
        return [f"{sessions_path}: missing"]
    sessions = pl.read_parquet(sessions_path)
    problems = []
    n_requests = requests.select(pl.len()).collect().item()
    if sessions.height != n_requests:
        problems.append(f"{sessions_path}: {sessions.height} rows for {n_requests} requests")
    nulls = sessions["session_id"].null_count()
    if nulls:
        problems.append(f"{sessions_path}: {nulls} rows without a session_id")
    bad = (
        sessions.group_by("session_id")
        .agg(
            pl.col("session_inferred").all().alias("inferred"),
            (pl.col("turn").sort() == pl.int_range(pl.len())).all().alias("dense"),
        )
        .filter(pl.col("inferred") & ~pl.col("dense"))
    )
    if bad.height:
        problems.append(
            f"{sessions_path}: {bad.height} inferred sessions whose turns are not 0..n-1 "
            f"(e.g. {bad['session_id'].sort().head(3).to_list()})"
        )
    return problems


def shared_prefix_ratio(summary: dict[str, Any]) -> dict[int, float]:
    """DOMAIN.md's shared-prefix ratio per window W (tokens) from a ``prefix_sharing.json``
    summary: the share of all requests whose first W tokens another request also starts with."""
    return {
        int(point["window_tokens"]): float(point["share"])
        for point in summary.get("curve", [])
        if point.get("share") is not None
    }
