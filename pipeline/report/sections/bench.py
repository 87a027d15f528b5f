"""Section 5's benchmarks: each candidate's capacity and cost at the SLO with the loads it was
judged at, the validity checks by benchmark, and the latency and cost figures."""

from __future__ import annotations

from pipeline.bench.result import FindingRow
from pipeline.capacity.fit import NOT_COMPARABLE
from pipeline.capacity.result import CapacityResult, ServingModel
from pipeline.present.text import NOTHING, number, usd
from pipeline.report.sections.content import Figure, ReportContent, figures
from pipeline.unknown import ResultModel, Unknown

PATTERN_WORDS = {"P": "passed", "F": "failed", "?": "not judged"}
#: The bench stage's capacity status in words (pipeline.bench.slo).
CAPACITY_STATUS_WORDS = {
    "bracketed": "between the last load that passed and the first that failed",
    "not_bracketed": "at least this: every load passed, the sweep stopped short of failing",
    "below_range": "below the lowest load: every load failed",
    "not_searched": "not searched (not an open-loop sweep)",
    "unknown": "unknown",
}
CHECK_STATUS_WORDS = {"flag": "flagged", "unknown": "unknown"}


class MeasuredCapacity(ResultModel):
    candidate: str
    points: str
    capacity: str
    status: str
    cost: str


class Issue(ResultModel):
    check: str
    status: str
    message: str


class Checks(ResultModel):
    """A benchmark's checks that flagged or could not judge, and the names of those passed."""

    candidate: str
    issues: list[Issue]
    ok: list[str]


class Bench(ResultModel):
    capacity: list[MeasuredCapacity]
    findings: list[Checks]
    figures: list[Figure]
    notes: list[str]


def bench(inputs: ReportContent) -> Bench:
    return Bench(
        capacity=[
            MeasuredCapacity(
                candidate=c.candidate,
                points=load_points_text(c.pattern),
                capacity=number(c.capacity_rps, 2, "req/s"),
                status=CAPACITY_STATUS_WORDS.get(c.capacity_status or "unknown", NOTHING),
                cost=usd(c.cost_per_1m_output_usd),
            )
            for c in inputs.capacity
        ],
        findings=_findings_by_benchmark(inputs.findings),
        # A cost chart of one bar says nothing the table does not.
        figures=figures(inputs, ("latency", "cost") if len(inputs.capacity) > 1 else ("latency",)),
        notes=_chunked_itl_notes(inputs.workload_capacity),
    )


def load_points_text(pattern: str | None) -> str:
    """The bench stage's load pattern (``1:? 31.4:P 122.59:F``: offered req/s and verdict) as
    words: "passed at 31.4 req/s; failed at 122.59 req/s; not judged at 1 req/s"."""
    if not pattern:
        return NOTHING
    by_verdict: dict[str, list[str]] = {}
    for point in pattern.split():
        load, _, verdict = point.rpartition(":")
        by_verdict.setdefault(verdict, []).append(load)
    return "; ".join(
        f"{PATTERN_WORDS.get(v, v)} at {', '.join(loads)} req/s" for v, loads in by_verdict.items()
    )


def _chunked_itl_notes(result: CapacityResult | None) -> list[str]:
    """Why a benchmark's ITL p50 line sits near zero, where the capacity stage found so."""
    notes = []
    for c in result.candidates if result else []:
        model = c.serving_model
        if not isinstance(model, ServingModel):
            continue
        chunked = [e.measured.get("itl_p50") for e in model.point_errors]
        if any(isinstance(m, Unknown) and m.reason.startswith(NOT_COMPARABLE) for m in chunked):
            notes.append(
                f"{c.candidate}: the ITL p50 line near zero is the tool timing gaps between "
                "streamed chunks of several tokens, not one decode step (its TPOT p50 is the "
                "per-token time); the SLO is judged on ITL p99."
            )
    return notes


def _findings_by_benchmark(findings: list[FindingRow]) -> list[Checks]:
    grouped: dict[str, Checks] = {}
    for f in findings:
        group = grouped.setdefault(f.candidate, Checks(candidate=f.candidate, issues=[], ok=[]))
        if f.status == "ok":
            group.ok.append(f.check.replace("_", " "))
        else:
            status = CHECK_STATUS_WORDS.get(f.status, f.status)
            group.issues.append(
                Issue(check=f.check.replace("_", " "), status=status, message=f.message)
            )
    return list(grouped.values())
