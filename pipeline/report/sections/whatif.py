"""Section 1's what-if: the named scenarios as a table, and the decision map with the sentence
that reads it."""

from __future__ import annotations

from pipeline.present.text import money
from pipeline.report.sections.content import ReportContent, svg_uri
from pipeline.unknown import ResultModel
from pipeline.whatif.present import changes_text, map_reading


class Scenario(ResultModel):
    name: str
    changes: str
    engine: str
    confidence: str
    monthly: str
    against: str


class DecisionMap(ResultModel):
    title: str
    src: str
    reading: str


class Whatif(ResultModel):
    scenarios: list[Scenario]
    map: DecisionMap | None


def whatif(inputs: ReportContent) -> Whatif | None:
    """None: `enginefit whatif` has not run."""
    found = inputs.whatif
    if found is None:
        return None
    rows = [
        Scenario(
            name=s.name,
            changes=changes_text(s.changes),
            engine=s.engine_name or "none",
            confidence=s.confidence,
            monthly=money(s.monthly_cost_usd) if s.monthly_cost_usd is not None else "unknown",
            against="; ".join(s.against_today) or "the same decision",
        )
        for s in found.scenarios
    ]
    drawn = found.map
    figure = None
    if drawn is not None and "decision_map" in inputs.figures:
        figure = DecisionMap(
            title=f"The decision map: the winning engine by {drawn.x.axis.replace('_', ' ')} "
            f"and {drawn.y.axis.replace('_', ' ')}",
            src=svg_uri(inputs.figures["decision_map"]),
            reading=map_reading(drawn),
        )
    return Whatif(scenarios=rows, map=figure)
