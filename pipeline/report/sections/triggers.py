"""Section 8, the revisit triggers: each with its rule in words, its value now and at the last
version, and why it matters (the requirement triggers in one row); and the previous version's
triggers checked against this run."""

from __future__ import annotations

from pipeline.decision.measures import MeasuredValue
from pipeline.decision.present import record_names, trigger_sentence
from pipeline.decision.result import DecisionRecord, TriggerCheck
from pipeline.present.text import NOTHING, measurement
from pipeline.report.sections.memo import trigger_priority
from pipeline.sources import split_cite
from pipeline.unknown import ResultModel

#: Triggers on the configuration's requirements: one row for all of them (each is "this key
#: changed"), the fired ones named.
REQUIREMENT_TRIGGER = "requirements.changed["


class Watched(ResultModel):
    id: str
    rule: str
    now: str
    last: str
    status: str
    why: str
    cite: str | None  # the source its reason cites


class Checked(ResultModel):
    """A previous version's trigger against this run."""

    id: str
    rule: str
    then: str
    now: str
    status: str


class Triggers(ResultModel):
    rows: list[Watched]
    previous: list[Checked] | None


def _short(value: MeasuredValue) -> str:
    """A trigger's value for a table cell: a structured requirement is referred to, not
    dumped (section 2 shows it)."""
    return "as configured" if isinstance(value, dict | list) else measurement(value)


def triggers(record: DecisionRecord) -> Triggers:
    name = record_names(record)
    last: dict[str, TriggerCheck] = (
        {c.id: c for c in record.previous.triggers} if record.previous else {}
    )
    watched = sorted(record.triggers, key=trigger_priority)
    requirements = [t for t in watched if t.id.startswith(REQUIREMENT_TRIGGER)]
    rows = [
        Watched(
            id=t.id,
            rule=trigger_sentence(t.metric, t.comparator, t.threshold, t.value.value, name),
            now=_short(t.value.value),
            last=_short(last[t.id].previous_value.value) if t.id in last else NOTHING,
            status=t.status.replace("_", " "),
            why=split_cite(t.why)[1],
            cite=split_cite(t.why)[0],
        )
        for t in watched
        if not t.id.startswith(REQUIREMENT_TRIGGER)
    ]
    if requirements:
        keys = [t.id.removeprefix(REQUIREMENT_TRIGGER).rstrip("]") for t in requirements]
        fired = [k for k, t in zip(keys, requirements, strict=True) if t.status == "fired"]
        rows.append(
            Watched(
                id=f"{REQUIREMENT_TRIGGER}…] ({len(keys)})",
                rule="Revisit if any requirement of section 2 is set differently next quarter: "
                + ", ".join(keys),
                now="as configured",
                last=NOTHING,
                status="fired" if fired else "not fired",
                why="a requirement the decision rests on has changed"
                + (f": {', '.join(fired)}" if fired else ""),
                cite=split_cite(requirements[0].why)[0],
            )
        )
    previous = None
    if record.previous is not None:
        previous = [
            Checked(
                id=c.id,
                rule=trigger_sentence(c.metric, c.comparator, c.threshold, c.value.value, name),
                then=_short(c.previous_value.value),
                now=_short(c.value.value),
                status=c.status.replace("_", " "),
            )
            for c in record.previous.triggers
        ]
    return Triggers(rows=rows, previous=previous)
