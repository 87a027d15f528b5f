"""The canonical workload: configured traces ingested into Parquet, with its quarantine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from assets.metadata import CHECK_PRIORITY, check_result, frame_preview, md, path_entries
from assets.resources import EnginefitStore
from pipeline.ingest import checks, stage
from pipeline.ingest.present import files_table, quarantine_rows
from pipeline.ingest.result import IngestSummary
from pipeline.present.tables import markdown_table


def ingest_metadata(
    summary: IngestSummary, paths: Mapping[str, Path], preview: pl.DataFrame
) -> dict[str, Any]:
    """What the UI shows of an ingest set (the workload's, or one day's)."""
    return {
        "dagster/row_count": summary.ingested,
        "records_read": summary.records_read,
        "quarantined": summary.quarantined,
        "quarantine_share": summary.quarantine_share,
        "quarantined_by_reason": md(markdown_table(quarantine_rows(summary))),
        "files": md(files_table(summary)),
        "first_arrival": summary.first_arrival or "",
        "last_arrival": summary.last_arrival or "",
        "span_s": summary.span_s,
        "out_of_order_sorted": summary.out_of_order,
        "duplicate_timestamps": summary.duplicate_timestamps,
        "block_size": summary.block_size,
        "tokenizer": summary.tokenizer + (" (approximate)" if summary.tokens_approximate else ""),
        "salt_fingerprint": summary.salt_fingerprint or "none (nothing hashed)",
        "anchor": (summary.anchor or "")
        + (" (built-in default)" if summary.anchor_is_default else ""),
        "warnings": md("\n".join(f"- {w}" for w in summary.warnings) or "none"),
        **path_entries({k: paths[k] for k in ("requests", "quarantine", "summary")}),
        "preview": frame_preview(preview.drop("prefix_hashes")),
    }


@dg.asset(kinds={"polars", "parquet"}, group_name="workload")
def workload(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Every configured trace file read into the canonical request table (Parquet, sorted by
    arrival); records that could not be used go to quarantine.parquet with file, line, field and
    reason, and ingest_summary.json reconciles the counts."""
    config = store.config()
    result = stage.run(stage.configured_inputs(config))
    paths = stage.write(result, config.layout())
    return dg.MaterializeResult(metadata=ingest_metadata(result.summary, paths, result.requests))


@dg.asset_check(
    op_tags=CHECK_PRIORITY, asset=workload, description="The workload has at least one request."
)
def workload_non_empty(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.non_empty(stage.read_requests(store.layout())))


@dg.asset_check(op_tags=CHECK_PRIORITY, asset=workload, description="No token count is negative.")
def workload_no_negative_tokens(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.no_negative_tokens(stage.read_requests(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY, asset=workload, description="Requests are stored in arrival order."
)
def workload_arrivals_sorted(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.arrivals_sorted(stage.read_requests(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=workload,
    description="The quarantined share of records stays under workload.quarantine_warn_share (warns).",
)
def workload_quarantine_share(store: EnginefitStore) -> dg.AssetCheckResult:
    config = store.config()
    summary = stage.read_summary(config.layout())
    threshold = config.require_workload().quarantine_warn_share
    return check_result(
        checks.quarantine_share_below(summary.records_read, summary.quarantined, threshold),
        warn=True,
    )


ASSETS = [workload]
CHECKS = [
    workload_non_empty,
    workload_no_negative_tokens,
    workload_arrivals_sorted,
    workload_quarantine_share,
]
