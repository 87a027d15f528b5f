"""Prefix sharing: the shared-prefix curve, reuse potential and (inferred) sessions."""

from __future__ import annotations

import dagster as dg

from assets.resources import EnginefitStore
from pipeline.prefix import analyse, curve_markdown, curve_svg, parse_prefix_config
from pipeline.prefix.report import reuse_markdown
from pipeline.prefix.stage import (
    CURVE_FILE,
    SESSIONS_FILE,
    STAGE,
    SUMMARY_FILE,
    SVG_FILE,
    sessions_consistent,
    write_prefix_outputs,
)
from pipeline.store import scan_requests


@dg.asset(deps=["workload"], kinds={"polars", "parquet"}, group_name="workload")
def prefix_sharing(store: EnginefitStore) -> dg.MaterializeResult:
    """Shared-prefix ratio by window W (count and prompt-token weighted), the curve's shape,
    the prompt tokens an unbounded prefix cache could serve (by how long ago the prefix was last
    seen, and across tenants), and conversation ids (logged or inferred from the hash chains).
    Writes prefix/prefix_sharing.json, curve.parquet, sessions.parquet and curve.svg."""
    cfg = store.config()
    config = parse_prefix_config(cfg.section("prefix"))
    requests = scan_requests(store.workload_dir()).collect()
    result = analyse(requests, config)
    out = store.stage_dir(STAGE)
    write_prefix_outputs(
        result, out, curve_svg(result.curve, f"Shared-prefix ratio — {cfg.workload.name}")
    )
    summary = result.summary
    cls = summary["classification"]
    reuse = summary["reuse"]
    sessions = summary["sessions"]
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": summary["requests"],
            "block_size": summary["block_size"],
            "shape": cls["shape"],
            "shape_reason": cls["reason"],
            "reuse_hit_share": reuse["hit_share"] if reuse["hit_share"] is not None else 0.0,
            "sessions": sessions["sessions"],
            "sessions_inferred": sessions["inferred"],
            "curve": dg.MetadataValue.md(curve_markdown(summary)),
            "reuse": dg.MetadataValue.md(reuse_markdown(summary)),
            "summary_path": dg.MetadataValue.path(str(out / SUMMARY_FILE)),
            "curve_path": dg.MetadataValue.path(str(out / CURVE_FILE)),
            "sessions_path": dg.MetadataValue.path(str(out / SESSIONS_FILE)),
            "plot_path": dg.MetadataValue.path(str(out / SVG_FILE)),
        }
    )


@dg.asset_check(
    asset=prefix_sharing,
    description="sessions.parquet has one row per request, turns start at 0 and are unique.",
)
def prefix_sessions_consistent(store: EnginefitStore) -> dg.AssetCheckResult:
    problems = sessions_consistent(
        scan_requests(store.workload_dir()), store.stage_dir(STAGE) / SESSIONS_FILE
    )
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none")},
    )


ASSETS = [prefix_sharing]
CHECKS = [prefix_sessions_consistent]
