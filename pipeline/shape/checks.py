"""Pure predicates over a shape result; each returns the list of problems (empty = pass)."""

from __future__ import annotations

from pipeline.shape.result import ShapeMetrics
from pipeline.unknown import Unknown


def estimates_labelled(shape: ShapeMetrics) -> list[str]:
    """Every estimated concurrency figure carries its latency model and says so."""
    c = shape.concurrency
    if not c.estimated:
        if c.durations_estimated or c.latency_model is not None:
            return ["concurrency says exact but some durations were estimated"]
        return []
    problems = []
    if c.latency_model is None:
        problems.append("estimated concurrency lacks its latency model")
    if not c.label.startswith("estimated"):
        problems.append(f"estimated concurrency is labelled {c.label!r}")
    unlabelled = [
        f.id
        for f in shape.findings
        if f.axis == "concurrency" and f.id.startswith("concurrency.") and not f.estimated
    ]
    if unlabelled:
        problems.append(f"findings {unlabelled} rest on estimated concurrency but are not flagged")
    return problems


def unsupported_have_reasons(shape: ShapeMetrics) -> list[str]:
    """Every statistic the timestamps cannot support says why (the typed result leaves no
    room for a number beside an unknown)."""
    a = shape.arrivals
    items = {**{f"window {k}": v for k, v in a.windows.items()}, "inter-arrival": a.inter_arrival}
    return [
        f"{name}: unsupported without a reason"
        for name, item in items.items()
        if isinstance(item, Unknown) and not item.reason.strip()
    ]
