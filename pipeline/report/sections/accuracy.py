"""The document's "predicted against measured" piece: where the workload's own traffic was
load-tested, each engine's capacity as the serving model predicted it without that traffic
against the capacity measured on it (the decision record's measurements), and the same signed
error in every earlier published version (the ledger keeps it), quarter over quarter.

Nothing is computed here but text: the figures are the capacity stage's, carried by the
decision record; the history is the ledger's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.decision import measures
from pipeline.decision.result import DecisionRecord
from pipeline.ledger import Entry, prediction_errors
from pipeline.present.text import NOTHING, UNKNOWN, number
from pipeline.unknown import ResultModel


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


class AccuracyRow(ResultModel):
    engine: str
    predicted: str
    measured: str
    error: str
    sentence: str


class AccuracyVersion(ResultModel):
    version: str
    errors: list[str]


class Accuracy(ResultModel):
    rows: list[AccuracyRow]
    engines: list[str]
    history: list[AccuracyVersion]
    metric: str


def _signed(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:+.1%}"


def prediction_accuracy(
    record: DecisionRecord, history: list[PublishedErrors], quarter: str, version: int
) -> Accuracy | None:
    """This version's predicted-against-measured rows and the errors over the published
    versions (a row per version, a column per engine); None when neither has any (nothing was
    ever load-tested on this workload's own traffic)."""
    now = prediction_errors(record.to_json()) or {}
    if not now and not history:
        return None
    names = {c.engine: c.name for c in record.candidates}

    def figure(metric: measures.Metric, engine: str) -> str:
        value = record.measured(metric.key(engine))
        return number(value if isinstance(value, int | float) else None, 2, "req/s")

    rows = [
        AccuracyRow(
            engine=names.get(engine, engine),
            predicted=figure(measures.PREDICTED_CAPACITY, engine),
            measured=figure(measures.MEASURED_CAPACITY, engine),
            error=_signed(error),
            sentence=str(record.measured(measures.PREDICTION_CHECK.key(engine)) or ""),
        )
        for engine, error in now.items()
    ]
    versions = [*history, PublishedErrors(quarter, version, now)]
    engines = sorted({e for v in versions for e in v.errors}, key=lambda e: names.get(e, e))
    return Accuracy(
        rows=rows,
        engines=[names.get(e, e) for e in engines],
        history=[
            AccuracyVersion(
                version=f"{v.quarter} v{v.version}" + (" (this one)" if v is versions[-1] else ""),
                errors=[_signed(v.errors[e]) if e in v.errors else NOTHING for e in engines],
            )
            for v in versions
        ],
        metric=measures.PREDICTION_ERROR.key("engine"),
    )
