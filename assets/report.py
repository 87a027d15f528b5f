"""The selection document as an asset, and the quarterly schedule that produces it
(logic: :mod:`pipeline.report.stage`).

``engine_selection_report`` depends on every stage, so the UI shows the lineage from trace
files to the PDF. It publishes ``<reports_dir>/<workload>/<quarter>/v<N>/`` (PDF, HTML, the
decision record and a manifest) unless nothing changed since the quarter's latest version.
The ``quarterly_report`` schedule runs the whole graph at 06:00 UTC on the first day of each
quarter for the quarter that ended; ``new_traces`` starts a run when a configured trace file
changes (off by default: turn it on in the UI).
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from assets.inputs import step_deps, trace_fingerprint
from assets.resources import EnginefitStore
from pipeline.config import Config
from pipeline.ledger import HTML, MANIFEST, quarter_of
from pipeline.report import stage

QUARTER_TAG = "enginefit/quarter"


@dg.asset(
    key=stage.STEP.asset,
    deps=step_deps(stage.STEP),
    group_name="report",
    kinds={"pdf", "html"},
)
def engine_selection_report(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """The versioned selection document: executive summary, requirements and SLO, workload
    shape, prefix sharing and routing, benchmarks, candidates, rationale, revisit triggers,
    changes since the previous version, and an appendix with the lineage."""
    config = store.config()
    sources = configured_inputs(config)
    published = stage.publish(sources, config.filing().tree, config.report)
    return dg.MaterializeResult(
        metadata={
            "quarter": published.quarter,
            "version": published.version,
            "new_version": published.created,
            "headline": sources.document.record.recommendation.headline,
            "pdf_path": dg.MetadataValue.path(str(published.pdf)),
            "html_path": dg.MetadataValue.path(str(published.folder / HTML)),
            "manifest_path": dg.MetadataValue.path(str(published.folder / MANIFEST)),
        }
    )


def configured_inputs(config: Config, quarter: str | None = None) -> stage.ReportInputs:
    """What a version of the configured workload is made from (``quarter``: else the
    configuration's, else the traffic's)."""
    return stage.read_inputs(
        config.layout(),
        config.report,
        config.provenance(),
        config.filing(),
        config.bench.policy(),
        quarter=quarter,
    )


def quarter_before(day: dt.date) -> str:
    """The quarter that ended before ``day`` (a run on 2026-10-01 reports on 2026-Q3)."""
    return quarter_of(day.replace(day=1) - dt.timedelta(days=1))


def _quarterly_request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    scheduled = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    quarter = quarter_before(scheduled.date())
    return dg.RunRequest(
        run_key=quarter,
        run_config={"resources": {"store": {"config": {"quarter": quarter}}}},
        tags={QUARTER_TAG: quarter},
    )


def schedules(job: dg.UnresolvedAssetJobDefinition) -> list[dg.ScheduleDefinition]:
    return [
        dg.ScheduleDefinition(
            name="quarterly_report",
            job=job,
            cron_schedule="0 6 1 1,4,7,10 *",
            execution_timezone="UTC",
            execution_fn=_quarterly_request,
            description="The whole graph for the quarter that ended, at the start of each quarter.",
        )
    ]


def sensors(job: dg.UnresolvedAssetJobDefinition) -> list[dg.SensorDefinition]:
    @dg.sensor(
        name="new_traces",
        job=job,
        minimum_interval_seconds=3600,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Runs the whole graph when a configured trace file changes.",
    )
    def new_traces(context: dg.SensorEvaluationContext, store: EnginefitStore) -> dg.SensorResult:
        fingerprint = trace_fingerprint(store.config())
        if fingerprint == context.cursor:
            return dg.SensorResult(skip_reason="no trace file changed")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=fingerprint)], cursor=fingerprint
        )

    return [new_traces]


ASSETS = [engine_selection_report]
CHECKS: list[dg.AssetChecksDefinition] = []
