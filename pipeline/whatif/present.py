"""The what-if result as text: today's decision, one block per scenario, and the map as a
character grid (one letter an engine, lower case a tie; ``*`` today's cell when on the grid)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pipeline.present.figures import COLORS, SMALL_FONT, cells_path, drawing, svg_bytes
from pipeline.present.text import money, money_band
from pipeline.whatif.result import DecisionMap, ScenarioOutcome, WhatifResult

# Behind a label drawn over the map, so it stays legible over hatching and lines.
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.75, "pad": 1}
# Ticks of a log-scaled map axis (factors of today's value), those within its range.
LOG_TICKS = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100)


def changes_text(changes: dict[str, Any]) -> str:
    """A scenario's changes in words (``traffic scale 2, hardware nvidia + amd``, ``gpu hour
    usd H100 $2.5/h``, ``slo ttft_p95_ms 500``)."""
    said = []
    for key, value in changes.items():
        if isinstance(value, list):
            shown = " + ".join(str(v) for v in value)
        elif isinstance(value, dict):
            # Only prices are dollars an hour; an SLO's keys carry their own unit.
            price = key == "gpu_hour_usd"
            shown = ", ".join(
                f"{k} ${_number(v)}/h" if price else f"{k} {_number(v)}" for k, v in value.items()
            )
        else:
            shown = _number(value)
        said.append(f"{key.replace('_', ' ')} {shown}")
    return ", ".join(said) or "nothing"


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cost(monthly_usd: float | None, band: tuple[float, float] | None) -> str:
    """A monthly GPU cost with its band (``$8,760/month GPU (band $6,570–$10,950)``)."""
    cost = "unknown" if monthly_usd is None else money(monthly_usd)
    return f"{cost}/month GPU" + (f" (band {money_band(band)})" if band is not None else "")


def scenario_lines(outcome: ScenarioOutcome) -> list[str]:
    changes = changes_text(outcome.changes)
    cost = _cost(outcome.monthly_cost_usd, outcome.monthly_cost_band_usd)
    lines = [
        f"{outcome.name} ({changes}):",
        f"  {outcome.engine_name or 'no engine'} ({outcome.confidence}"
        + (f"; runner-up {outcome.runner_up_name}" if outcome.runner_up_name else "")
        + ")"
        + (f" with {outcome.routing_layer}" if outcome.routing_layer else "")
        + f", {cost}",
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
    cost = _cost(result.today_monthly_cost_usd, result.today_monthly_cost_band_usd)
    lines = [
        f"what-if for {result.workload}: today {result.today_engine or 'no engine'} "
        f"({result.today_confidence}), {cost}",
        "",
    ]
    for outcome in result.scenarios:
        lines += [*scenario_lines(outcome), ""]
    if result.map is not None:
        lines += map_lines(result.map)
    return "\n".join(lines).rstrip() + "\n"


def _edges(values: list[float], log: bool) -> list[float]:
    """Cell edges around grid values: midpoints (geometric on a log axis), the ends mirrored."""
    if log:
        mids = [math.sqrt(a * b) for a, b in itertools.pairwise(values)]
        first, last = values[0] ** 2 / mids[0], values[-1] ** 2 / mids[-1]
    else:
        mids = [(a + b) / 2 for a, b in itertools.pairwise(values)]
        first, last = 2 * values[0] - mids[0], 2 * values[-1] - mids[-1]
    return [first, *mids, last]


def label_cell(found: DecisionMap, engine: str) -> tuple[int, int]:
    """The cell to write an engine's name in: among its cells, the one with most of its own
    cells around it (the middle of its largest region), the first such in row order."""
    cells = found.cells
    rows, columns = len(cells), len(cells[0])

    def room(i: int, j: int) -> int:
        return sum(
            1
            for dj in range(-3, 4)
            for di in range(-4, 5)
            if 0 <= j + dj < rows and 0 <= i + di < columns and cells[j + dj][i + di] == engine
        )

    own = [(i, j) for j in range(rows) for i in range(columns) if cells[j][i] == engine]
    middle = sum(i for i, _ in own) / len(own), sum(j for _, j in own) / len(own)
    return max(
        own,
        key=lambda cell: (room(*cell), -abs(cell[0] - middle[0]) - abs(cell[1] - middle[1])),
    )


def map_svg(found: DecisionMap) -> bytes:
    """The decision map as a figure: regions coloured by the winning engine (Okabe-Ito),
    ties hatched, each region labelled, today's point marked, today's flips (dashed) and
    revisit triggers (dotted) drawn where they fall on the axes."""
    from matplotlib.patches import Patch, PathPatch  # import here: only drawing loads matplotlib
    from matplotlib.ticker import NullLocator  # import here: likewise

    engines = sorted(found.engines)
    index = {e: k for k, e in enumerate(engines)}
    none = len(engines)  # no engine recommended: light grey
    colours = [COLORS[k % len(COLORS)] for k in range(len(engines))] + ["#DDDDDD"]
    grid = [[index.get(e, none) if e else none for e in row] for row in found.cells]
    xs, ys = _edges(found.x.values, found.x.log), _edges(found.y.values, found.y.log)
    with drawing(7.0, 4.6) as fig:
        ax = fig.subplots()
        ax.grid(False)
        # One filled path per engine and one hatched path for the ties, not a shape per cell.
        for value, colour in enumerate(colours):
            chosen = [[cell == value for cell in row] for row in grid]
            if any(map(any, chosen)):
                ax.add_patch(
                    PathPatch(cells_path(xs, ys, chosen), facecolor=colour, alpha=0.85, lw=0)
                )
        if any(map(any, found.ties)):
            ax.add_patch(
                PathPatch(
                    cells_path(xs, ys, found.ties),
                    fill=False,
                    hatch="////",
                    edgecolor="white",
                    linewidth=0,
                )
            )
        if found.x.log:
            ax.set_xscale("log")
        if found.y.log:
            ax.set_yscale("log")
        for axis, log, low, high in (
            (ax.xaxis, found.x.log, xs[0], xs[-1]),
            (ax.yaxis, found.y.log, ys[0], ys[-1]),
        ):
            if log:
                ticks = [t for t in LOG_TICKS if low <= t <= high]
                axis.set_ticks(ticks, labels=[f"×{t:g}" for t in ticks])
                axis.set_minor_locator(NullLocator())
        ax.set_xlim(xs[0], xs[-1])
        ax.set_ylim(ys[0], ys[-1])
        for engine in engines:
            i, j = label_cell(found, engine)
            ax.text(
                found.x.values[i],
                found.y.values[j],
                found.engines[engine],
                ha="center",
                va="center",
                fontsize=SMALL_FONT + 2,
                fontweight="bold",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 2},
            )
        for mark in found.marks:
            low, high = (xs[0], xs[-1]) if mark.axis == "x" else (ys[0], ys[-1])
            if not low <= mark.value <= high:
                continue
            flip = mark.kind == "flip"
            width, dashes = (1.2, "--") if flip else (0.9, ":")
            label = (
                f"→ {found.engines.get(mark.engine or '', mark.engine or 'none')} "
                f"({mark.value:.3g})"
                if flip
                else mark.id.removesuffix(".enters").removesuffix(".leaves")
                + f" ({mark.value:.3g})"
            )
            if mark.axis == "x":
                ax.axvline(mark.value, color="black", linewidth=width, linestyle=dashes)
                ax.annotate(
                    label,
                    (mark.value, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(2, -2 if flip else -12),
                    textcoords="offset points",
                    rotation=90,
                    ha="left",
                    va="top",
                    fontsize=SMALL_FONT,
                    bbox=LABEL_BOX,
                )
            else:
                ax.axhline(mark.value, color="black", linewidth=width, linestyle=dashes)
                ax.annotate(
                    label,
                    (1.0, mark.value),
                    xycoords=("axes fraction", "data"),
                    xytext=(-2, 2),
                    textcoords="offset points",
                    ha="right",
                    va="bottom",
                    fontsize=SMALL_FONT,
                    bbox=LABEL_BOX,
                )
        x_today, y_today = found.x.today, found.y.today
        if x_today is not None and y_today is not None:
            ax.plot(
                x_today, y_today, marker="*", markersize=14, color="white", markeredgecolor="black"
            )
            ax.annotate(
                "today",
                (x_today, y_today),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=SMALL_FONT + 1,
                fontweight="bold",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )
        ax.set_xlabel(f"{found.x.axis.replace('_', ' ')} ({found.x.unit})")
        ax.set_ylabel(f"{found.y.axis.replace('_', ' ')} ({found.y.unit})")
        handles = [Patch(facecolor=colours[index[e]], label=found.engines[e]) for e in engines] + [
            Patch(facecolor="white", edgecolor="grey", hatch="////", label="tie (within band)")
        ]
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=len(handles),
            fontsize=SMALL_FONT,
            frameon=False,
        )
        return svg_bytes(fig)


def axis_value(axis: str, value: float) -> str:
    """A value on a map axis in words."""
    if axis == "traffic":
        return f"×{value:.3g} today's traffic"
    if axis == "gpu_price":
        return f"×{value:.3g} today's GPU price"
    if axis == "model_changes":
        return f"{value:.3g} model changes a quarter"
    return f"a {value:.0%} shared-prefix share"


def map_reading(found: DecisionMap) -> str:
    """The map in a sentence: where today is and which engine takes over at each flip that
    falls on it."""
    today = found.engines.get(found.today_engine or "", "no engine")
    axes = {"x": found.x, "y": found.y}
    where = [axis_value(a.axis, a.today) for a in (found.x, found.y) if a.today is not None]
    text = f"We are here: {today}" + (f" at {' and '.join(where)}" if where else "") + "."
    for mark in found.marks:
        axis = axes[mark.axis]
        if mark.kind != "flip" or not axis.values[0] <= mark.value <= axis.values[-1]:
            continue
        side = "past" if mark.id.endswith(".up") else "below"
        taker = found.engines.get(mark.engine or "", mark.engine or "no engine")
        text += f" {taker} takes over {side} {axis_value(axis.axis, mark.value)}."
    return text
