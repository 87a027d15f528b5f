"""Section 7, the decision rationale: each rule of the decision tree with its outcome, source
and evidence, what would flip the answer, and the excluded candidates."""

from __future__ import annotations

from pipeline.decision.present import RULE_OUTCOME_WORDS
from pipeline.decision.result import DecisionRecord
from pipeline.present.text import measurement
from pipeline.unknown import ResultModel


class RuleOutcome(ResultModel):
    title: str
    status: str
    effect: str
    source: str
    evidence: list[str]


class ExcludedCandidate(ResultModel):
    engine: str
    reasons: list[str]


class Flip(ResultModel):
    engine: str
    condition: str


class Rationale(ResultModel):
    rules: list[RuleOutcome]
    excluded: list[ExcludedCandidate]
    flips: list[Flip]


def rationale(record: DecisionRecord) -> Rationale:
    return Rationale(
        rules=[
            RuleOutcome(
                title=r.title,
                status=RULE_OUTCOME_WORDS[r.fired],
                effect=r.effect,
                source=r.source,
                evidence=[f"{k} = {measurement(v)}" for k, v in r.evidence.items()],
            )
            for r in record.rationale
        ],
        excluded=[
            ExcludedCandidate(engine=c.name, reasons=c.reasons)
            for c in record.candidates
            if c.status == "excluded"
        ],
        flips=[
            Flip(engine=c.name, condition=c.flip_condition)
            for c in record.candidates
            if c.flip_condition
        ],
    )
