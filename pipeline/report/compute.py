"""The selection document's content: every number the template shows, with its unit and
sensible rounding, built section by section (:mod:`pipeline.report.sections`) from the typed
stage results and the decision record (nothing is recomputed here; figures are the stages' own
SVGs).

The template (``templates/engine-selection.html.j2``) only lays this out, so a test can check
the executive summary against the decision record without reading the PDF's layout.
"""

from __future__ import annotations

from pipeline.report.sections.accuracy import Accuracy, prediction_accuracy
from pipeline.report.sections.appendix import Appendix, appendix
from pipeline.report.sections.bench import Bench, bench
from pipeline.report.sections.catalog import Engines, catalog
from pipeline.report.sections.changes import Changes, changes
from pipeline.report.sections.content import ReportContent, data_range
from pipeline.report.sections.dates import Dated, dates
from pipeline.report.sections.memo import Memo, decision_memo
from pipeline.report.sections.prefix import Prefix, prefix
from pipeline.report.sections.rationale import Rationale, rationale
from pipeline.report.sections.requirements import Requirements, requirements
from pipeline.report.sections.shape import Shape, shape
from pipeline.report.sections.summary import Summary, executive_summary
from pipeline.report.sections.triggers import Triggers, triggers
from pipeline.report.sections.whatif import Whatif, whatif
from pipeline.report.sections.workings import Working, workings
from pipeline.report.sections.workload_cost import WorkloadCost, workload_cost
from pipeline.sources import cited_sources
from pipeline.unknown import ResultModel


class Document(ResultModel):
    """Everything the template shows, section by section, in the document's order."""

    title: str
    organisation: str | None
    workload: str
    quarter: str
    version: int
    report_date: str
    data_range: str
    memo: Memo
    dates: list[Dated]
    summary: Summary
    whatif: Whatif | None
    requirements: Requirements
    shape: Shape
    prefix: Prefix
    bench: Bench
    workload_cost: WorkloadCost
    accuracy: Accuracy | None
    catalog: Engines
    rationale: Rationale
    triggers: Triggers
    changes: Changes | None
    workings: list[Working]
    appendix: Appendix


def build(inputs: ReportContent) -> Document:
    record = inputs.record
    document = Document(
        title=inputs.title,
        organisation=inputs.organisation,
        workload=inputs.workload,
        quarter=inputs.quarter,
        version=inputs.version,
        report_date=inputs.report_date.isoformat(),
        data_range=data_range(inputs.ingest),
        memo=decision_memo(record, inputs.layer_name()),
        dates=dates(inputs),
        summary=executive_summary(inputs),
        whatif=whatif(inputs),
        requirements=requirements(inputs),
        shape=shape(inputs),
        prefix=prefix(inputs),
        bench=bench(inputs),
        workload_cost=workload_cost(inputs),
        accuracy=prediction_accuracy(
            record, inputs.prediction_history, inputs.quarter, inputs.version
        ),
        catalog=catalog(inputs.catalog, inputs.report_date),
        rationale=rationale(record),
        triggers=triggers(record),
        changes=changes(inputs),
        workings=workings(inputs),
        appendix=appendix(inputs),
    )
    # The sources list holds exactly what the text cites (rules, triggers, cache sizing …); the
    # appendix's lineage (paths, configuration, hashes) cites nothing.
    sources = cited_sources(document.model_dump(exclude={"appendix"}))
    listed = document.appendix.model_copy(update={"sources": sources})
    return document.model_copy(update={"appendix": listed})
