"""Section 1, the executive summary: the recommendation, its routing layer and isolation, how
sure it is, and each candidate's headline figures."""

from __future__ import annotations

from pipeline.decision.present import payback_cell
from pipeline.decision.result import Candidate, Confidence, IsolationAdvice
from pipeline.present.text import money, number, usd
from pipeline.report.sections.content import ReportContent
from pipeline.unknown import ResultModel

#: A candidate's standing in words: "viable" alone reads as an endorsement it is not.
CANDIDATE_STATUS_WORDS = {
    "recommended": "recommended",
    "runner-up": "runner-up",
    "viable": "runs here, not preferred",
    "excluded": "ruled out",
}


class CandidateRow(ResultModel):
    """A candidate's headline figures as shown (the changes section compares them)."""

    engine: str
    status: str
    cost: str
    benchmark_cost: str
    capacity: str
    gpus: str
    monthly: str
    payback: str  # months, never (it saves nothing), unknown (a cost is missing) or —


class Excluded(ResultModel):
    engine: str
    why: str


class PreviousDecision(ResultModel):
    as_of: str
    engine: str
    fired: list[str]


class Summary(ResultModel):
    engine: str
    routing_layer: str | None
    routing_reason: str
    routing_layer_choice: str | None
    isolation: IsolationAdvice | None  # what untrusted tenants need (None: nothing, or unknown)
    runner_up: str
    confidence: Confidence
    confidence_reasons: list[str]
    state: str
    headline: str
    candidates: list[CandidateRow]
    excluded: list[Excluded]
    previous: PreviousDecision | None


def executive_summary(inputs: ReportContent) -> Summary:
    record = inputs.record
    rec = record.recommendation
    names = {c.engine: c.name for c in record.candidates}
    previous = record.previous
    return Summary(
        engine=rec.engine_name or "no engine",
        routing_layer=inputs.layer_name(),
        routing_reason=record.routing.reason,
        routing_layer_choice=record.routing.layer_choice,
        isolation=rec.isolation,
        runner_up=names.get(rec.runner_up or "", "none"),
        confidence=rec.confidence,
        confidence_reasons=rec.confidence_reasons,
        state=rec.state,
        headline=rec.headline,
        candidates=[candidate_row(c) for c in record.candidates if c.status != "excluded"],
        excluded=[
            Excluded(engine=c.name, why=c.reasons[0] if c.reasons else "")
            for c in record.candidates
            if c.status == "excluded"
        ],
        previous=None
        if previous is None
        else PreviousDecision(
            as_of=previous.as_of or "the previous version",
            engine=names.get(previous.engine or "", previous.engine or "none"),
            fired=previous.fired,
        ),
    )


def candidate_row(c: Candidate) -> CandidateRow:
    return CandidateRow(
        engine=c.name,
        status=CANDIDATE_STATUS_WORDS[c.status],
        cost=usd(c.cost_per_1m_output_usd)
        + (" (benchmark's)" if c.cost_basis == "benchmark" else ""),
        benchmark_cost=usd(c.benchmark_cost_per_1m_output_usd),
        # this workload's whenever the capacity stage carried the benchmark to it
        capacity=number(
            c.workload_capacity_rps if c.capacity_basis is not None else c.capacity_rps, 2, "req/s"
        ),
        gpus=number(c.gpus_at_peak),
        monthly=money(c.monthly_bill()),
        payback=payback_cell(c.payback),
    )
