"""Page 1 of the selection document: the decision memo a VP approves or not in five minutes.

It answers, in this order and in plain words, from the decision record alone: what is asked
(engine and routing layer; switch, stay or start), what it costs a month for this traffic
against the alternatives (each with the reason it is or is not the choice), how sure the
decision is, the few measurable changes that would reopen it, and the next steps. Nothing is
computed here that the record does not hold; the later sections carry the workings.
"""

from __future__ import annotations

from pipeline.decision.result import Candidate, DecisionRecord, Rule, Trigger
from pipeline.present.text import money, money_band, usd
from pipeline.sources import split_cite
from pipeline.unknown import ResultModel

#: The rules whose firing points the decision tree at engines (their effect says where).
TREE_RULES = ("local", "concurrency", "model_churn", "prefix")
#: How many triggers page 1 shows: what fired first, then what would flip the answer.
MEMO_TRIGGERS = 3

CONFIDENCE_WORDS = {
    "firm": "Firm: the costs are measured or carried to this traffic by a model that fits its "
    "benchmarks, and no open question would change the choice.",
    "provisional": "Provisional: the direction is sound, but the figures it rests on are not yet "
    "measured on this traffic.",
    "tie": "A tie: the leading engines cost about the same here; the choice rests on "
    "maintenance and migration, not on price.",
}


def _tree_reason(record: DecisionRecord) -> str | None:
    """The effect of the last tree rule that fired: where the decision tree points."""
    fired: list[Rule] = [r for r in record.rationale if r.rule in TREE_RULES and r.fired]
    return fired[-1].effect if fired else None


def _cost_rule(record: DecisionRecord) -> Rule | None:
    return next((r for r in record.rationale if r.rule == "cost"), None)


def _why(c: Candidate, record: DecisionRecord, tree: str | None) -> str:
    """Why a candidate is or is not the choice, in one sentence."""
    cost = _cost_rule(record)
    priced = cost is not None and cost.fired is not None
    if c.status == "recommended":
        if priced and cost is not None:
            return f"Chosen: {cost.effect}"
        return f"Chosen by the decision tree: {tree}" if tree else "Chosen by the decision tree"
    if c.status == "runner-up":
        return "Runner-up: " + (c.flip_condition or c.cost_note or "next in the decision tree")
    if c.status == "excluded":
        return "ruled out: " + (c.reasons[0] if c.reasons else "see the rationale")
    lacks = [r for r in c.reasons if r != "not benchmarked on this traffic"]
    told = f"; also {'; '.join(lacks)}" if lacks else ""
    chosen = record.recommendation.engine_name or "another engine"
    return f"Not chosen: it runs on your hardware, but the rules point to {chosen} here{told}"


def _ask(record: DecisionRecord, layer_name: str | None) -> str:
    rec = record.recommendation
    if rec.engine is None:
        return "No engine can be recommended yet: " + rec.headline
    what = rec.engine_name or rec.engine
    with_layer = f", with prefix-aware routing through {layer_name}" if layer_name else ""
    current = record.requirements.get("current_engine")
    names = {c.engine: c.name for c in record.candidates}
    if current is None:
        move = "No engine serves this workload today: this is a new deployment."
    elif current == rec.engine:
        move = f"This keeps {what}, which serves the workload today."
    else:
        move = f"This is a switch from {names.get(current, current)}, which serves it today."
    return f"Approve {what} as the inference engine for {record.workload}{with_layer}. {move}"


def _trigger_sentence(t: Trigger) -> str:
    """A trigger's reason as a sentence: capitalised unless it starts with a name that keeps
    its own case (vLLM), one full stop."""
    why = split_cite(t.why)[1].rstrip(". ")
    first = why.split(" ", 1)[0]
    if first.islower():
        why = why[:1].upper() + why[1:]
    return f"{why}." + (" It has fired." if t.status == "fired" else "")


# What a leader most needs first: what fired, what would flip the answer, then the axes of the
# decision tree.
_TRIGGER_ORDER = (
    "flip",
    "cost.margin",
    "bench.stale",
    "traffic.",
    "prefix.",
    "concurrency.",
    "engine.",
    "fleet.",
    "catalog.",
)


def trigger_priority(trigger: Trigger) -> tuple[int, int, str]:
    """Sort key: fired first, then by ``_TRIGGER_ORDER``, then by id."""
    rank = next((i for i, p in enumerate(_TRIGGER_ORDER) if trigger.id.startswith(p)), 99)
    if trigger.id.endswith(".beyond_search"):
        rank = 98  # the edge of a range searched without a flip: least telling
    return (trigger.status != "fired", rank, trigger.id)


def _next_steps(record: DecisionRecord, layer_name: str | None) -> list[str]:
    rec = record.recommendation
    steps: list[str] = []
    unmeasured = [
        c.name
        for c in record.candidates
        if c.status in ("recommended", "runner-up") and c.capacity_basis != "measured"
    ]
    if unmeasured:
        steps.append(
            f"Replay this traffic against {' and '.join(unmeasured)} with `enginefit loadtest` "
            "(dataset enginefit-trace) and re-run the report: the costs then become measured, "
            "not carried over from another request mix."
        )
    chosen = next((c for c in record.candidates if c.status == "recommended"), None)
    current = record.requirements.get("current_engine")
    if chosen is not None and current not in (None, chosen.engine) and chosen.switch_cost_usd:
        steps.append(
            f"Plan the migration to {chosen.name}: {money(chosen.switch_cost_usd)} one-off"
            + (
                f", paid back in {chosen.payback_months:.1f} months."
                if chosen.payback_months is not None
                else "."
            )
        )
    if layer_name:
        steps.append(f"Deploy {layer_name} in front of the replicas (prefix-aware routing).")
    advice = rec.isolation
    if advice is not None:
        cost = f" ({advice.cost})" if advice.cost else ""
        steps.append(f"Untrusted tenants: {advice.action}{cost}.")
    if rec.engine is not None:
        steps.append(
            "Next quarter, run `enginefit report` on the new traces: it checks every trigger "
            "below and says whether one fired."
        )
    return steps


class Option(ResultModel):
    engine: str
    monthly: str
    #: The monthly cost's band, shown under it (None: no band, e.g. a measured-only cost).
    monthly_band: str | None
    per_1m: str
    why: str


class RuledOut(ResultModel):
    engine: str
    why: str


class Memo(ResultModel):
    ask: str
    options: list[Option]
    ruled_out: list[RuledOut]
    confidence: str
    confidence_reasons: list[str]
    changes: list[str]
    next_steps: list[str]


def decision_memo(record: DecisionRecord, layer_name: str | None) -> Memo:
    """What page 1 shows (``layer_name``: the recommended routing layer's display name)."""
    tree = _tree_reason(record)
    rec = record.recommendation
    return Memo(
        ask=_ask(record, layer_name),
        options=[
            Option(
                engine=c.name,
                monthly=money(c.monthly_bill()),
                # the capacity band carried into the bill, where there is one
                monthly_band=f"band {money_band(band)}"
                if (band := c.monthly_bill_band())
                else None,
                per_1m=usd(c.cost_per_1m_output_usd),
                why=_why(c, record, tree),
            )
            for c in record.candidates
            if c.status != "excluded"
        ],
        ruled_out=[
            RuledOut(engine=c.name, why=_why(c, record, tree))
            for c in record.candidates
            if c.status == "excluded"
        ],
        confidence=CONFIDENCE_WORDS[rec.confidence],
        confidence_reasons=rec.confidence_reasons[:2],
        changes=[
            _trigger_sentence(t)
            for t in sorted(record.triggers, key=trigger_priority)[:MEMO_TRIGGERS]
        ],
        next_steps=_next_steps(record, layer_name),
    )
