"""Section 10's lineage: the traces read, every input and upstream output with its sha256, the
code and catalog versions, the configuration and every source the text cites."""

from __future__ import annotations

import yaml

from pipeline.present.text import NOTHING, number
from pipeline.report.sections.content import ReportContent
from pipeline.unknown import ResultModel


class TraceFile(ResultModel):
    file: str
    format: str
    sha256: str
    read: str
    ingested: str
    quarantined: str
    reasons: str


class Digest(ResultModel):
    path: str
    sha256: str


class CodeVersion(ResultModel):
    package_version: str
    git_commit: str | None  # None: not a git checkout
    git_dirty: bool  # uncommitted changes to the code that renders and decides


class CatalogVersion(ResultModel):
    source: str | None
    as_of: str | None
    sha256: str | None


class Appendix(ResultModel):
    files: list[TraceFile]
    inputs: list[Digest]
    configuration: str  # as YAML
    code: CodeVersion
    catalog: CatalogVersion
    decision_inputs: list[Digest]
    sources: list[str]  # every source the document's text cites


def appendix(inputs: ReportContent) -> Appendix:
    """Without its sources, which the document lists from its whole text."""
    catalog = inputs.record.catalog
    return Appendix(
        files=[
            TraceFile(
                file=f.file,
                format=f.format,
                sha256=f.sha256,
                read=number(f.records_read),
                ingested=number(f.ingested),
                quarantined=number(f.quarantined),
                reasons=", ".join(f"{k}: {v:,}" for k, v in sorted(f.quarantined_by_reason.items()))
                or NOTHING,
            )
            for f in inputs.ingest.files
        ],
        inputs=[Digest(path=p, sha256=d) for p, d in sorted(inputs.inputs.items())],
        configuration=yaml.safe_dump(inputs.configuration, sort_keys=False, allow_unicode=True),
        code=CodeVersion.model_validate(inputs.code),
        catalog=CatalogVersion(
            source=catalog.get("source"), as_of=catalog.get("as_of"), sha256=catalog.get("sha256")
        ),
        decision_inputs=[Digest(path=p, sha256=d) for p, d in inputs.record.inputs.items()],
        sources=[],
    )
