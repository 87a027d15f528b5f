"""Revisit triggers: measurable conditions that reopen the decision
(docs/decision-rules.md#revisit-triggers), and their evaluation a quarter later.

Each trigger compares one entry of the record's ``measurements`` (a flat mapping whose keys name
the stage output they come from, e.g. ``shape.concurrency.peak`` is ``concurrency.peak`` of
``shape/workload_shape.json``) with a threshold. A later run recomputes the measurements from
its own stage outputs and evaluates the previous record's triggers: ``fired``, ``not_fired``, or
``unknown`` when the metric is missing now (or was never known).
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.decision.catalog import UNDATED
from pipeline.decision.measures import MeasuredValue, measured
from pipeline.decision.result import DecisionRecord, Previous, Trigger, TriggerCheck
from pipeline.errors import InputFormatError

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


# A payback that never comes (``decision.payback_months``) compares as infinitely long, and an
# undated catalog fact (``catalog.oldest_fact_age_days``) as infinitely old.
NEVER = "never"
INFINITE = (NEVER, UNDATED)


def crossed(value: Any, comparator: str, threshold: Any) -> bool | None:
    """Whether ``value comparator threshold`` holds; None when it cannot be told."""
    if value is None or threshold is None:
        return None
    if value in INFINITE and isinstance(threshold, int | float):
        value = math.inf
    try:
        return bool(_COMPARE[comparator](value, threshold))
    except TypeError:
        return None


_ORDERING = frozenset({">", ">=", "<", "<="})


def _is_number(value: Any) -> bool:
    """A finite int or float: ``true`` is not 1, and ``"NaN"`` is text."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def refuse_unordered_triggers(record: DecisionRecord, where: str) -> None:
    """A record read back whose ordering trigger (``<``, ``>``...) holds a threshold that is
    not a number, or a value that is neither a number, unknown (null) nor "never", is refused
    naming the trigger: it would be printed as if a number and never fire."""
    for i, t in enumerate(record.triggers):
        if t.comparator not in _ORDERING:
            continue
        if not _is_number(t.threshold):
            raise InputFormatError(
                f"{where}: triggers[{i}].threshold: {t.threshold!r} is not a number, and trigger "
                f"{t.id} compares {t.metric} {t.comparator} it; give the record as `enginefit "
                "decide` wrote it"
            )
        value = t.value.value
        if value is not None and value != NEVER and not _is_number(value):
            raise InputFormatError(
                f"{where}: triggers[{i}].value: {value!r} is not a number (or null), and "
                f"trigger {t.id} compares {t.metric} {t.comparator} a threshold; give the "
                "record as `enginefit decide` wrote it"
            )


def status_of(value: Any, comparator: str, threshold: Any) -> str:
    result = crossed(value, comparator, threshold)
    return "unknown" if result is None else ("fired" if result else "not_fired")


def trigger(
    id: str,
    metric: str,
    comparator: str,
    threshold: MeasuredValue,
    measurements: Mapping[str, MeasuredValue],
    why: str,
) -> Trigger:
    value = measurements.get(metric)
    return Trigger(
        id=id,
        metric=metric,
        comparator=comparator,  # type: ignore[arg-type]
        threshold=threshold,
        value=measured(metric, value),
        why=why,
        status=status_of(value, comparator, threshold),  # type: ignore[arg-type]
    )


def evaluate_previous(
    previous: DecisionRecord, measurements: Mapping[str, MeasuredValue]
) -> Previous:
    """The previous record's triggers against this run's measurements."""
    checks = [
        TriggerCheck(
            id=t.id,
            metric=t.metric,
            comparator=t.comparator,
            threshold=t.threshold,
            previous_value=t.value,
            value=measured(t.metric, measurements.get(t.metric)),
            why=t.why,
            status=status_of(measurements.get(t.metric), t.comparator, t.threshold),  # type: ignore[arg-type]
        )
        for t in previous.triggers
    ]
    return Previous(
        workload=previous.workload,
        as_of=previous.as_of,
        engine=previous.recommendation.engine,
        record_sha256=record_digest(previous),
        triggers=checks,
        fired=[c.id for c in checks if c.status == "fired"],
    )


def record_digest(record: DecisionRecord) -> str:
    """sha256 of the record's canonical JSON (what the record file holds)."""
    text = json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
