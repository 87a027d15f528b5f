"""What ingestion produces: the canonical table, the quarantine, and counts that reconcile."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl


@dataclass(frozen=True)
class FileSummary:
    file: str
    format: str
    sha256: str
    records_read: int
    ingested: int
    quarantined: int
    quarantined_by_reason: dict[str, int]


@dataclass(frozen=True)
class SkippedFile:
    """A file given more than once (same path, or same bytes as an earlier one): read once."""

    file: str
    same_as: str
    reason: str  # "same path" or "same content"


@dataclass(frozen=True)
class IngestSummary:
    """Per file and in total: ``records_read == ingested + quarantined``."""

    files: list[FileSummary]
    records_read: int
    ingested: int
    quarantined: int
    quarantined_by_reason: dict[str, int]
    out_of_order: int
    duplicate_timestamps: int
    duplicate_request_ids: int
    first_arrival: str | None
    last_arrival: str | None
    span_s: float
    block_size: int
    tokenizer: str
    tokens_approximate: bool
    salt_fingerprint: str | None = None  # None: no salt (nothing needed one)
    # Rows whose hashed prompt outran the logged prompt_tokens (pipeline.ingest.readers.base
    # .capped_prompt_blocks); 0 in summaries written before the count existed.
    prompt_blocks_capped: int = 0
    notes: list[str] = field(default_factory=list)
    # The date relative timestamps count from, and whether it is the built-in default rather
    # than one the user set (the dates of a relative trace are then placeholders).
    anchor: str | None = None
    anchor_is_default: bool = False
    skipped_files: list[SkippedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def quarantine_share(self) -> float:
        return self.quarantined / self.records_read if self.records_read else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IngestSummary:
        files = [FileSummary(**f) for f in data["files"]]
        skipped = [SkippedFile(**f) for f in data.get("skipped_files", [])]
        return cls(**{**data, "files": files, "skipped_files": skipped})


@dataclass
class IngestResult:
    requests: pl.DataFrame
    quarantine: pl.DataFrame
    summary: IngestSummary
