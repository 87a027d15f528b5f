"""The prefix-sharing analysis end to end: curve, classification, reuse and sessions."""

from __future__ import annotations

from typing import Any

import polars as pl

from pipeline.prefix.compute import (
    CURVE_SCHEMA,
    at_block_size,
    classify_curve,
    reuse_per_request,
    reuse_summary,
    sharing_curve,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.prefix.result import PrefixResult
from pipeline.sessions import infer_sessions

SCHEMA_VERSION = 1


def session_stats(sessions: pl.DataFrame, min_blocks: int) -> dict[str, Any]:
    """Sessions, turns per session (p50 / p99 / max) and whether the ids were inferred."""
    if sessions.height == 0:
        return {
            "requests": 0,
            "sessions": 0,
            "inferred": False,
            "logged_requests": 0,
            "inferred_requests": 0,
            "turns_p50": None,
            "turns_p99": None,
            "turns_max": None,
            "multi_turn_sessions": 0,
            "requests_in_multi_turn_sessions_share": None,
            "min_match_blocks": min_blocks,
        }
    per_session = sessions.group_by("session_id").agg(pl.len().alias("turns"))
    turns = per_session["turns"]
    inferred_requests = int(sessions["session_inferred"].sum())
    multi = per_session.filter(pl.col("turns") > 1)
    return {
        "requests": sessions.height,
        "sessions": per_session.height,
        "inferred": inferred_requests > 0,
        "logged_requests": sessions.height - inferred_requests,
        "inferred_requests": inferred_requests,
        "turns_p50": float(turns.quantile(0.5, interpolation="nearest") or 0),
        "turns_p99": float(turns.quantile(0.99, interpolation="nearest") or 0),
        "turns_max": int(turns.max() or 0),  # type: ignore[arg-type]
        "multi_turn_sessions": multi.height,
        "requests_in_multi_turn_sessions_share": int(multi["turns"].sum()) / sessions.height,
        "min_match_blocks": min_blocks,
    }


def analyse(requests: pl.DataFrame, config: PrefixConfig) -> PrefixResult:
    """Curve, classification, reuse potential and sessions of a canonical table sorted by arrival.

    Sessions are inferred at the table's own block size; the curve and reuse at
    ``config.block_size`` when set (a multiple of the table's).
    """
    sessions = infer_sessions(requests, min_blocks=config.min_session_match_blocks)
    table, block_size = at_block_size(requests, config.block_size)
    known = table.filter(pl.col("hashes_known").fill_null(False))
    # Count-only traces: no block structure, so no curve (and nothing can hit).
    curve = sharing_curve(table, block_size) if known.height else pl.DataFrame(schema=CURVE_SCHEMA)
    median_prompt = known["prompt_tokens"].median() if known.height else None
    classification = classify_curve(
        curve,
        float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
        config,
    )
    reuse = reuse_per_request(table, block_size, config.reuse_age_buckets_s)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "block_size": block_size if known.height else None,
        "requests": requests.height,
        "requests_hashes_known": known.height,
        "requests_hashes_unknown": requests.height - known.height,
        "median_prompt_tokens": float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
        "curve": curve.to_dicts(),
        "classification": classification,
        "reuse": reuse_summary(reuse, config.reuse_age_buckets_s),
        "sessions": session_stats(sessions, config.min_session_match_blocks),
        "config": {
            "min_session_match_blocks": config.min_session_match_blocks,
            "reuse_age_buckets_s": list(config.reuse_age_buckets_s),
        },
    }
    return PrefixResult(summary=summary, curve=curve, sessions=sessions, reuse=reuse)
