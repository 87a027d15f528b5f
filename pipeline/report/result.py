"""What the report stage produces: one version's rendered document and decision record, with
what identifies it (quarter, number, identity hash, manifest), and where it was published."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.report.config import JsonDocument


@dataclass(frozen=True)
class ReportResult:
    quarter: str
    version: int
    identity: str  # sha256 of everything the version is made from
    manifest: JsonDocument  # without the record's hash, added when it is written
    headline: str
    html: str
    pdf: bytes
    record: bytes


@dataclass(frozen=True)
class Published:
    """What ``write`` did: ``created`` False when an identical version already existed."""

    created: bool
    quarter: str
    version: int
    folder: Path
    pdf: Path
