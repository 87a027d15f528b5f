"""Pure predicates over a written decision record; each returns the list of problems (empty:
the check passes). The assets wrap them as Dagster asset checks."""

from __future__ import annotations

from typing import Any

from pipeline.decision.result import DecisionRecord
from pipeline.errors import InputFormatError


def record_valid(data: Any, where: str) -> list[str]:
    """The record validates against its schema (pipeline.decision.result)."""
    try:
        DecisionRecord.from_json(data, where)
    except InputFormatError as exc:
        return [str(exc)]
    return []


def excluded_have_reasons(record: DecisionRecord) -> list[str]:
    """Every excluded candidate names at least one rule that excluded it."""
    return [
        f"{c.engine} is excluded without a reason"
        for c in record.candidates
        if c.status == "excluded" and not c.reasons
    ]


def triggers_measurable(record: DecisionRecord) -> list[str]:
    """Every trigger reads a measurement the record holds (so a later run can evaluate it)."""
    return [
        f"trigger {t.id} reads {t.metric}, which the record does not measure"
        for t in record.triggers
        if t.metric not in record.measurements
    ]
