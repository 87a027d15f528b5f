"""The what-if result as text: today's decision, one block per scenario, and the map as a
character grid (one letter an engine, lower case a tie; ``*`` today's cell when on the grid)."""

from __future__ import annotations

from pipeline.present.text import money
from pipeline.whatif.result import DecisionMap, ScenarioOutcome, WhatifResult


def scenario_lines(outcome: ScenarioOutcome) -> list[str]:
    changes = ", ".join(f"{k}={v}" for k, v in outcome.changes.items()) or "nothing"
    cost = money(outcome.monthly_cost_usd) if outcome.monthly_cost_usd is not None else "unknown"
    lines = [
        f"{outcome.name} ({changes}):",
        f"  {outcome.engine_name or 'no engine'} ({outcome.confidence}"
        + (f"; runner-up {outcome.runner_up_name}" if outcome.runner_up_name else "")
        + ")"
        + (f" with {outcome.routing_layer}" if outcome.routing_layer else "")
        + f", {cost}/month GPU",
        "  against today: " + ("; ".join(outcome.against_today) or "the same decision"),
    ]
    return lines + [f"  applied: {note}" for note in outcome.approximations]


def letters(found: DecisionMap) -> dict[str, str]:
    """A distinct upper-case letter for each engine on the map (its name's first free one)."""
    out: dict[str, str] = {}
    for engine, name in sorted(found.engines.items()):
        free = [c for c in name.upper() + engine.upper() if c.isalpha() and c not in out.values()]
        out[engine] = free[0] if free else "?"
    return out


def map_lines(found: DecisionMap) -> list[str]:
    code = letters(found)
    xs, ys = found.x.values, found.y.values
    today = _nearest(xs, found.x.today), _nearest(ys, found.y.today)
    lines = [
        f"decision map: {found.x.axis} ({found.x.unit}) across, {found.y.axis} ({found.y.unit})"
        f" up; {found.decisions} decisions"
    ]
    for j in range(len(ys) - 1, -1, -1):
        row = ""
        for i in range(len(xs)):
            engine = found.cells[j][i]
            letter = code[engine] if engine else "."
            row += "*" if (i, j) == today else letter.lower() if found.ties[j][i] else letter
        lines.append(f"{ys[j]:>8.3g} {row}")
    lines.append(f"{'':>8} {xs[0]:.3g} … {xs[-1]:.3g}")
    legend = ", ".join(f"{code[e]} {name}" for e, name in sorted(found.engines.items()))
    lines.append(f"{legend}; lower case: a tie; . no engine; * today")
    lines += [f"  {m.kind} on {m.axis} at {m.value:.4g}: {m.text}" for m in found.marks]
    return lines


def _nearest(values: list[float], today: float | None) -> int | None:
    """The grid index today falls on (within half a step), else None."""
    if today is None:
        return None
    index = min(range(len(values)), key=lambda i: abs(values[i] - today))
    step = abs(values[1] - values[0]) if len(values) > 1 else 0.0
    return index if abs(values[index] - today) <= step / 2 else None


def render_text(result: WhatifResult) -> str:
    cost = (
        money(result.today_monthly_cost_usd)
        if result.today_monthly_cost_usd is not None
        else "unknown"
    )
    lines = [
        f"what-if for {result.workload}: today {result.today_engine or 'no engine'} "
        f"({result.today_confidence}), {cost}/month GPU",
        "",
    ]
    for outcome in result.scenarios:
        lines += [*scenario_lines(outcome), ""]
    if result.map is not None:
        lines += map_lines(result.map)
    return "\n".join(lines).rstrip() + "\n"
