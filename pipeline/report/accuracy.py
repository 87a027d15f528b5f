"""The document's "predicted against measured" piece: where the workload's own traffic was
load-tested, each engine's capacity as the serving model predicted it without that traffic
against the capacity measured on it (the decision record's measurements), and the same signed
error in every earlier published version (the ledger keeps it), quarter over quarter.

Nothing is computed here but text: the figures are the capacity stage's, carried by the
decision record; the history is the ledger's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.decision.present import PREDICTION_CHECK
from pipeline.decision.result import DecisionRecord
from pipeline.ledger import PREDICTION_ERROR, Entry, prediction_errors
from pipeline.present.text import NOTHING, UNKNOWN, number


@dataclass(frozen=True)
class PublishedErrors:
    """One earlier published version's prediction errors, by engine (None: unknown then)."""

    quarter: str
    version: int
    errors: dict[str, float | None]


def published_errors(entries: list[Entry], quarter: str, version: int) -> list[PublishedErrors]:
    """The versions published before ``quarter`` v``version`` (in the ledger's publication
    order; a re-render of a listed version sees only those before it) that carry errors."""
    earlier = []
    for entry in entries:
        if (entry.quarter, entry.version) == (quarter, version):
            break
        if entry.prediction_errors:
            earlier.append(PublishedErrors(entry.quarter, entry.version, entry.prediction_errors))
    return earlier


def _signed(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:+.1%}"


def prediction_accuracy(
    record: DecisionRecord, history: list[PublishedErrors], quarter: str, version: int
) -> dict[str, Any] | None:
    """This version's predicted-against-measured rows and the errors over the published
    versions (a row per version, a column per engine); None when neither has any (nothing was
    ever load-tested on this workload's own traffic)."""
    now = prediction_errors(record.model_dump(mode="json")) or {}
    if not now and not history:
        return None
    names = {c.engine: c.name for c in record.candidates}
    measured = record.measurements
    rows = [
        {
            "engine": names.get(engine, engine),
            "predicted": number(measured.get(f"capacity.predicted_rps[{engine}]"), 2, "req/s"),
            "measured": number(measured.get(f"capacity.measured_rps[{engine}]"), 2, "req/s"),
            "error": _signed(error),
            "sentence": str(measured.get(f"{PREDICTION_CHECK}[{engine}]") or ""),
        }
        for engine, error in now.items()
    ]
    versions = [*history, PublishedErrors(quarter, version, now)]
    engines = sorted({e for v in versions for e in v.errors}, key=lambda e: names.get(e, e))
    return {
        "rows": rows,
        "engines": [names.get(e, e) for e in engines],
        "history": [
            {
                "version": f"{v.quarter} v{v.version}"
                + (" (this one)" if v is versions[-1] else ""),
                "errors": [_signed(v.errors[e]) if e in v.errors else NOTHING for e in engines],
            }
            for v in versions
        ],
        "metric": f"{PREDICTION_ERROR}[engine]",
    }
