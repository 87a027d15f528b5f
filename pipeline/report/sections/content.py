"""What the document is built from (the typed stage results and the decision record), and the
pieces several sections share: figures as data URIs, a candidate's capacity-stage result, the
traffic's date range and an engine status's age."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass, field

from pipeline.bench.result import CapacityRow, FindingRow
from pipeline.capacity.result import CandidateCapacity, CapacityResult
from pipeline.costing import Prices
from pipeline.dates import days_from
from pipeline.decision.catalog import Catalog
from pipeline.decision.result import DecisionRecord
from pipeline.ingest.result import IngestSummary
from pipeline.prefix.result import PrefixSummary
from pipeline.present.text import UNKNOWN
from pipeline.report.config import JsonDocument
from pipeline.report.sections.accuracy import PublishedErrors
from pipeline.shape.result import ShapeMetrics
from pipeline.sim.result import ScenarioSummary
from pipeline.unknown import ResultModel
from pipeline.whatif.result import WhatifResult


@dataclass(frozen=True)
class PreviousVersion:
    """The version this one is compared with (same quarter, else the previous quarter)."""

    quarter: str
    version: int
    manifest: JsonDocument
    record: DecisionRecord


@dataclass(frozen=True)
class ReportContent:
    workload: str
    quarter: str
    version: int
    title: str
    organisation: str | None
    record: DecisionRecord
    ingest: IngestSummary
    shape: ShapeMetrics
    prefix: PrefixSummary | None
    scenarios: list[ScenarioSummary]
    capacity: list[CapacityRow]
    findings: list[FindingRow]
    slo: str
    prices: Prices
    catalog: Catalog
    configuration: JsonDocument
    configuration_sha256: str
    code: dict[str, str | bool | None]
    inputs: dict[str, str]
    # The report date (pipeline.dates) and where it came from; each benchmark candidate's
    # oldest run date; how old a benchmark may be before it is stale.
    report_date: dt.date
    report_date_source: str
    bench_runs: dict[str, dt.date | None]
    max_age_days: int
    figures: dict[str, bytes] = field(default_factory=dict)
    previous: PreviousVersion | None = None
    # The capacity stage's result (None: it has not run; the costs are then the benchmark's).
    workload_capacity: CapacityResult | None = None
    # The what-if scenarios and decision map (None: `enginefit whatif` has not run).
    whatif: WhatifResult | None = None
    # Earlier published versions' capacity prediction errors, from the ledger.
    prediction_history: list[PublishedErrors] = field(default_factory=list)
    # How the capacity curves were sampled (pipeline.sim.present.curve_sampling_note); None:
    # they are exact.
    curve_note: str | None = None

    def layer_name(self) -> str | None:
        """The recommended routing layer's display name (None: no layer)."""
        layer = self.record.routing.layer
        return self.catalog.layers[layer].name if layer else None


def capacities(
    record: DecisionRecord, result: CapacityResult | None
) -> dict[str, CandidateCapacity | None]:
    """Each candidate engine's capacity-stage result (None: not carried to this workload): its
    benchmark's, else the only one of the same engine."""
    found = {c.candidate: c for c in result.candidates} if result else {}
    out: dict[str, CandidateCapacity | None] = {}
    for c in record.candidates:
        same = [f for f in found.values() if f.deployment.engine.lower() == c.engine.lower()]
        out[c.engine] = found.get(c.benchmark or "", same[0] if len(same) == 1 else None)
    return out


class Figure(ResultModel):
    title: str
    src: str  # a data: URI, so the HTML stands alone and the PDF fetches nothing


FIGURE_TITLES = {
    "arrivals": "Arrivals over time",
    "lengths": "Prompt and output length distributions (tokens)",
    "concurrency": "Requests in flight over time",
    "prefix_curve": "Shared-prefix ratio by window W (tokens)",
    "hit_ratio": "Prefix-cache hit ratio by cache size per replica",
    "imbalance": "Load imbalance against hit ratio, per routing",
    "latency": "Latency against offered load, with the SLO limits",
    "cost": "Cost per 1M output tokens at the SLO",
}


def svg_uri(svg: bytes) -> str:
    """An SVG as a data: URI."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def figures(inputs: ReportContent, names: tuple[str, ...]) -> list[Figure]:
    return [
        Figure(title=FIGURE_TITLES[n], src=svg_uri(inputs.figures[n]))
        for n in names
        if n in inputs.figures
    ]


def data_range(summary: IngestSummary) -> str:
    first, last = summary.first_arrival, summary.last_arrival
    if not first or not last:
        return UNKNOWN
    return f"{first[:16].replace('T', ' ')} to {last[:16].replace('T', ' ')} UTC"


def status_words(state: str, since: dt.date, date: dt.date) -> str:
    """``maintenance since 2025-12-11, 353 days before the report date``."""
    later = " (a later catalog records it)" if since > date else ""
    return f"{state} since {since.isoformat()}, {days_from(since, date)} the report date{later}"
