"""The dates the decision rests on (the title page's table), each with its age from the report
date in words; and which quarters the traffic spans."""

from __future__ import annotations

import datetime as dt

from pipeline.dates import days_from
from pipeline.ingest.result import IngestSummary
from pipeline.ledger import quarter_key, quarter_of
from pipeline.report.sections.content import ReportContent, data_range, status_words
from pipeline.unknown import ResultModel


class Dated(ResultModel):
    what: str
    when: str


def dates(inputs: ReportContent) -> list[Dated]:
    """Every date the decision rests on, with its age measured from the report date in words
    (a date after the report date is said so, never a negative age)."""
    date = inputs.report_date
    rows = [Dated(what="Report date", when=f"{date.isoformat()} ({inputs.report_date_source})")]
    last = inputs.ingest.last_arrival
    traffic_end = dt.date.fromisoformat(last[:10]) if last else None
    if traffic_end is not None:
        when = f"{data_range(inputs.ingest)}; its last day {days_from(traffic_end, date)} the report date"
        rows.append(Dated(what="Traffic", when=when))
    for candidate, run in sorted(inputs.bench_runs.items()):
        rows.append(Dated(what=f"Benchmark {candidate}", when=_run_age(run, date, inputs)))
    catalog = inputs.catalog.as_of
    rows.append(
        Dated(
            what="Engine catalog",
            when=f"as of {catalog.isoformat()}, {days_from(catalog, date)} the report date"
            + (": it describes the engines as known then" if catalog > date else ""),
        )
    )
    for engine in inputs.catalog.engines.values():
        if engine.status.since is not None:
            when = status_words(engine.status.state, engine.status.since, date)
            rows.append(Dated(what=engine.name, when=when))
    span = traffic_quarters(inputs.ingest)
    if span is not None and not quarter_holds_traffic(inputs.quarter, inputs.ingest):
        when = (
            f"filed under {inputs.quarter} (report.allow_other_quarter); the traffic is from {span}"
        )
        rows.append(Dated(what="Quarter", when=when))
    return rows


def traffic_quarters(summary: IngestSummary) -> str | None:
    """``2025-Q1`` or ``2025-Q1 to 2025-Q2``: the quarters the traffic spans (None: undated)."""
    if not summary.first_arrival or not summary.last_arrival:
        return None
    first, last = quarter_of(summary.first_arrival), quarter_of(summary.last_arrival)
    return first if first == last else f"{first} to {last}"


def quarter_holds_traffic(quarter: str, summary: IngestSummary) -> bool:
    """Whether any of the traffic falls in ``quarter`` (True when its dates are not known)."""
    if not summary.first_arrival or not summary.last_arrival:
        return True
    first, last = quarter_of(summary.first_arrival), quarter_of(summary.last_arrival)
    return quarter_key(first) <= quarter_key(quarter) <= quarter_key(last)


def _run_age(run: dt.date | None, date: dt.date, inputs: ReportContent) -> str:
    if run is None:
        return "run date not recorded (add run_date to its manifest): age unknown"
    words = f"run {run.isoformat()}, {days_from(run, date)} the report date"
    if (date - run).days > inputs.max_age_days:
        words += f" (older than the {inputs.max_age_days} days a benchmark stays current)"
    last = inputs.ingest.last_arrival
    if last and run > dt.date.fromisoformat(last[:10]):
        words += "; after the traffic's last day"
    return words
