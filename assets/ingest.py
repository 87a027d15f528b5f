"""The canonical workload: configured traces ingested into Parquet, with its quarantine."""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
from dagster import OpExecutionContext

from assets.inputs import TRACE_FILES, WORKLOAD_FOLDER, step_deps
from assets.metadata import (
    CHECK_PRIORITY,
    INGEST_PRIORITY,
    check_result,
    frame_preview,
    md,
    path_entries,
)
from assets.resources import EnginefitStore
from pipeline.commands.ingest import configured_inputs
from pipeline.ingest import checks, stage
from pipeline.ingest.present import anchor_text, files_table, quarantine_rows
from pipeline.ingest.result import IngestSummary, SkippedFile
from pipeline.present.tables import markdown_table
from pipeline.store import read_requests


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
        "anchor": anchor_text(summary) if summary.anchor else "",
        "warnings": md("\n".join(f"- {w}" for w in summary.warnings) or "none"),
        **path_entries({k: paths[k] for k in ("requests", "quarantine", "summary")}),
        "preview": frame_preview(preview.drop("prefix_hashes")),
    }


def _step_key(planned: stage.PlannedSource) -> str:
    """A mapping key the UI shows: position and file name (letters, digits, _ only)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(planned.label).name)[:48]
    return f"{planned.position:03d}_{name}"


# The trace files and the workload folder are read from outside the graph.
DEPS = step_deps(stage.STEP, TRACE_FILES, WORKLOAD_FOLDER)


@dg.op(
    ins={key: dg.In(dg.Nothing) for key in DEPS},
    out={"files": dg.DynamicOut(stage.PlannedSource), "skipped": dg.Out(list)},
    tags=INGEST_PRIORITY,
)
def ingest_plan(store: EnginefitStore, **upstream: Any) -> Any:
    """The configured trace files, once each (a file named twice, or the same bytes twice, is
    read once): one dynamic output per file."""
    planned, skipped = stage.plan(configured_inputs(store.config()))
    for source in planned:
        yield dg.DynamicOutput(source, output_name="files", mapping_key=_step_key(source))
    yield dg.Output(skipped, output_name="skipped")


@dg.op(tags=INGEST_PRIORITY)
def ingest_file(store: EnginefitStore, planned: stage.PlannedSource) -> stage.StagedRead:
    """One trace file read (format detected by content, or as configured) into canonical rows
    and its quarantine; the files of a workload are read side by side. The rows go to
    staging files of the workload folder, a chunk of the file each, which the merge reads."""
    config = store.config()
    return stage.read_stage(configured_inputs(config), planned, config.layout())


@dg.op
def ingest_merge(
    context: OpExecutionContext,
    store: EnginefitStore,
    reads: list[stage.StagedRead],
    skipped: list[SkippedFile],
) -> dict[str, Any]:
    """Every file's rows in one table: repeated request ids quarantined (the first wins), one
    block size, sorted by arrival; published with its quarantine and summary as one set, one
    request part at a time (the staged rows are read back a few columns at a time)."""
    config = store.config()
    merged = stage.merge_publish(configured_inputs(config), reads, skipped, config.layout())
    context.add_output_metadata(ingest_metadata(merged.summary, merged.paths, merged.preview))
    return {"ingested": merged.summary.ingested, "requests": str(merged.paths["requests"])}


@dg.graph_asset(
    name=stage.STEP.asset,
    ins={key: dg.AssetIn(key, dagster_type=dg.Nothing) for key in DEPS},
    group_name="workload",
    kinds={"polars", "parquet"},
)
def workload(**upstream: Any) -> Any:
    """Every configured trace file read into the canonical request table (Parquet, sorted by
    arrival), one step per file; records that could not be used go to quarantine.parquet with
    file, line, field and reason, and ingest_summary.json reconciles the counts."""
    files, skipped = ingest_plan(**upstream)
    return ingest_merge(files.map(ingest_file).collect(), skipped)


@dg.asset_check(
    op_tags=CHECK_PRIORITY, asset=workload, description="The workload has at least one request."
)
def workload_non_empty(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.non_empty(read_requests(store.layout())))


@dg.asset_check(op_tags=CHECK_PRIORITY, asset=workload, description="No token count is negative.")
def workload_no_negative_tokens(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.no_negative_tokens(read_requests(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY, asset=workload, description="Requests are stored in arrival order."
)
def workload_arrivals_sorted(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.arrivals_sorted(read_requests(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=workload,
    description=f"The quarantined share of records stays under {checks.QUARANTINE_WARN_SHARE:.0%} "
    "(warns).",
)
def workload_quarantine_share(store: EnginefitStore) -> dg.AssetCheckResult:
    summary = stage.read_summary(store.config().layout())
    return check_result(
        checks.quarantine_share_below(summary.records_read, summary.quarantined),
        warn=True,
    )


ASSETS = [workload]
CHECKS = [
    workload_non_empty,
    workload_no_negative_tokens,
    workload_arrivals_sorted,
    workload_quarantine_share,
]
