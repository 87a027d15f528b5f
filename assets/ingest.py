"""The canonical workload: configured traces ingested into Parquet, with its quarantine."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl

from assets.metadata import frame_markdown, frame_preview
from assets.resources import EnginefitStore
from pipeline import checks
from pipeline.ingest import ingest_sources, write_workload
from pipeline.readers import ReadContext, SourceFile
from pipeline.store import SUMMARY_FILE, scan_requests
from pipeline.tokenize import make_tokenizer


@dg.asset(kinds={"polars", "parquet"}, group_name="workload")
def workload(store: EnginefitStore) -> dg.MaterializeResult:
    """Every configured trace file read into the canonical request table (Parquet, sorted by
    arrival); records that could not be used go to quarantine.parquet with file, line, field and
    reason, and ingest_summary.json reconciles the counts."""
    cfg = store.config().workload
    ctx = ReadContext(
        block_size=cfg.block_size,
        salt=cfg.salt_bytes,
        anchor=cfg.anchor,
        tokenizer=make_tokenizer(cfg.tokenizer),
    )
    sources = [SourceFile.of(t.path, t.display) for t in cfg.traces]
    result = ingest_sources(sources, ctx, formats=[t.format for t in cfg.traces])
    paths = write_workload(result, store.workload_dir())
    summary = result.summary
    by_reason = pl.DataFrame(
        {
            "reason": list(summary.quarantined_by_reason),
            "records": list(summary.quarantined_by_reason.values()),
        },
        schema={"reason": pl.String, "records": pl.Int64},
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": summary.ingested,
            "records_read": summary.records_read,
            "quarantined": summary.quarantined,
            "quarantine_share": summary.quarantine_share,
            "quarantined_by_reason": dg.MetadataValue.md(frame_markdown(by_reason)),
            "first_arrival": summary.first_arrival or "",
            "last_arrival": summary.last_arrival or "",
            "span_s": summary.span_s,
            "out_of_order_sorted": summary.out_of_order,
            "duplicate_timestamps": summary.duplicate_timestamps,
            "block_size": summary.block_size,
            "tokenizer": summary.tokenizer
            + (" (approximate)" if summary.tokens_approximate else ""),
            "salt_fingerprint": summary.salt_fingerprint,
            "requests_path": dg.MetadataValue.path(str(paths["requests"])),
            "quarantine_path": dg.MetadataValue.path(str(paths["quarantine"])),
            "summary_path": dg.MetadataValue.path(str(paths["summary"])),
            "preview": frame_preview(result.requests.drop("prefix_hashes")),
        }
    )


def _result(problems: list[str], *, warn: bool = False) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR,
        metadata={"problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none")},
    )


@dg.asset_check(asset=workload, description="The workload has at least one request.")
def workload_non_empty(store: EnginefitStore) -> dg.AssetCheckResult:
    return _result(checks.non_empty(scan_requests(store.workload_dir())))


@dg.asset_check(asset=workload, description="No token count is negative.")
def workload_no_negative_tokens(store: EnginefitStore) -> dg.AssetCheckResult:
    return _result(checks.no_negative_tokens(scan_requests(store.workload_dir())))


@dg.asset_check(asset=workload, description="Requests are stored in arrival order.")
def workload_arrivals_sorted(store: EnginefitStore) -> dg.AssetCheckResult:
    return _result(checks.arrivals_sorted(scan_requests(store.workload_dir())))


@dg.asset_check(
    asset=workload,
    description="The quarantined share of records stays under workload.quarantine_warn_share (warns).",
)
def workload_quarantine_share(store: EnginefitStore) -> dg.AssetCheckResult:
    summary = json.loads((store.workload_dir() / SUMMARY_FILE).read_text())
    threshold = store.config().workload.quarantine_warn_share
    return _result(
        checks.quarantine_share_below(summary["records_read"], summary["quarantined"], threshold),
        warn=True,
    )


ASSETS = [workload]
CHECKS = [
    workload_non_empty,
    workload_no_negative_tokens,
    workload_arrivals_sorted,
    workload_quarantine_share,
]
