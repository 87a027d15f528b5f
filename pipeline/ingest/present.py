"""The ingest summary for a person: text for the terminal, tables for Dagster and the report."""

from __future__ import annotations

from typing import Any

from pipeline.ingest.compute import dated_from_default_anchor
from pipeline.ingest.result import IngestSummary
from pipeline.present.tables import markdown_table


def quarantine_rows(summary: IngestSummary) -> list[dict[str, Any]]:
    """Quarantined records by reason (sorted by reason)."""
    return [
        {"reason": reason, "records": count}
        for reason, count in sorted(summary.quarantined_by_reason.items())
    ]


def files_table(summary: IngestSummary) -> str:
    """Per input file: format and the counts that reconcile."""
    return markdown_table(
        [
            {
                "file": f.file,
                "format": f.format,
                "read": f.records_read,
                "ingested": f.ingested,
                "quarantined": f.quarantined,
            }
            for f in summary.files
        ]
    )


def summary_text(summary: IngestSummary) -> str:
    """What was read, ingested and quarantined (by file and by reason), the span, the notes."""
    lines = [
        f"read {summary.records_read:,} records from {len(summary.files)} file(s): "
        f"{summary.ingested:,} ingested, {summary.quarantined:,} quarantined "
        f"({summary.quarantine_share:.2%})",
    ]
    for f in summary.files:
        lines.append(
            f"  {f.file} [{f.format}]: read {f.records_read:,}, ingested {f.ingested:,}, "
            f"quarantined {f.quarantined:,}"
        )
    for row in quarantine_rows(summary):
        lines.append(f"  quarantined {row['reason']}: {row['records']:,}")
    if summary.first_arrival:
        lines.append(
            f"span {summary.first_arrival} .. {summary.last_arrival} ({summary.span_s:,.1f} s)"
        )
    lines.append(
        f"out of order: {summary.out_of_order:,} (sorted); duplicate timestamps: "
        f"{summary.duplicate_timestamps:,}; duplicate request ids: "
        f"{summary.duplicate_request_ids:,}"
    )
    approx = " (approximate)" if summary.tokens_approximate else ""
    lines.append(f"block size {summary.block_size}; tokenizer {summary.tokenizer}{approx}")
    if summary.anchor:
        lines.append(f"anchor of relative timestamps: {anchor_text(summary)}")
    lines.extend(f"note: {note}" for note in summary.notes)
    lines.extend(f"warning: {warning}" for warning in summary.warnings)
    return "\n".join(lines)


def anchor_text(summary: IngestSummary) -> str:
    """The anchor and where it came from; the built-in one only matters when it dated some
    arrivals (a trace of absolute times never reads it)."""
    if not summary.anchor_is_default:
        return f"{summary.anchor} (set by you)"
    if summary.first_arrival is not None and not dated_from_default_anchor(summary.first_arrival):
        return "none needed: every timestamp is an absolute time"
    return f"{summary.anchor} (the built-in default, not set by you: workload.anchor or --anchor)"
