"""Prefix sharing as an asset with its check (logic: pipeline.prefix.stage)."""

from __future__ import annotations

import dagster as dg
import polars as pl

from assets.inputs import step_deps
from assets.metadata import CHECK_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.prefix import checks, stage
from pipeline.prefix.present import curve_markdown, reuse_markdown
from pipeline.store import read_requests


@dg.asset(
    key=stage.STEP.asset,
    deps=step_deps(stage.STEP),
    kinds={"polars", "parquet"},
    group_name="workload",
)
def prefix_sharing(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Shared-prefix ratio by window W (count and prompt-token weighted), the curve's shape,
    the prompt tokens an unbounded prefix cache could serve (by how long ago the prefix was last
    seen, and across tenants), and conversation ids (logged or inferred from the hash chains)."""
    config = store.config()
    layout = config.layout()
    inputs = stage.read_inputs(layout)
    result = stage.run(inputs, config.prefix)
    paths = stage.write(result, layout)
    summary = result.summary
    hit_share = summary.reuse.hit_share
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": summary.requests,
            "block_size": summary.block_size,
            "shape": summary.classification.shape,
            "shape_reason": summary.classification.reason,
            "reuse_hit_share": hit_share if hit_share is not None else "unknown: no content",
            "sessions": summary.sessions.sessions,
            "sessions_inferred": summary.sessions.inferred,
            "curve": md(curve_markdown(summary)),
            "reuse": md(reuse_markdown(summary)),
            # what was carried on from the days read before (a union of days only)
            **({"resumed": "\n".join(inputs.said)} if inputs.said else {}),
            **path_entries(paths),
        }
    )


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=prefix_sharing,
    description="sessions.parquet has one row per request, turns start at 0 and are unique.",
)
def prefix_sessions_consistent(store: EnginefitStore) -> dg.AssetCheckResult:
    layout = store.layout()
    n_requests = read_requests(layout).select(pl.len()).collect().item()
    return check_result(checks.sessions_consistent(stage.read_result(layout).sessions, n_requests))


ASSETS = [prefix_sharing]
CHECKS = [prefix_sessions_consistent]
