"""Flip conditions, one per axis the decision rests on: the value of each input at which the
recommended engine changes.

Every flip is found the same way, from the decision itself rather than a second formula: the
decision is a pure function (the rules, then the cost ranking and the payback), so it is
re-run with one input moved outward from today's value along a grid until the recommended
engine changes, and that crossing is bisected to ``RELATIVE_PRECISION``. Moved just past the
flip value the answer is the other engine; just before it, today's. No change within the
range searched is said as such ("no flip within …"), never guessed beyond it.

The axes (``AXES``), each moved alone:

- ``volume``: the traffic × k (mean and peak rates, and peak concurrency with them, by
  Little's law at the same latency); every fleet re-sized in whole replicas for the bills.
  Capacity per replica is held at today's (the same mix).
- ``model_changes``: ``requirements.model_changes_per_quarter`` (the change costs).
- ``prefix_share``: the shared-prefix share the decision tree's prefix branches read; the
  costs stay today's (the capacity stage priced today's cache hits).
- ``gpu_price``: every engine's $/GPU-hour × k alike (against the model-change costs, which
  are mostly people's time).
- ``cost[engine]``: one engine's cost per 1M output tokens × k (its capacity ÷ k): the
  runner-up's falling, the recommended engine's rising.
- ``hardware``: one hardware target added to or removed from ``requirements.hardware``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, get_args

from pipeline.decision.catalog import HardwareTarget
from pipeline.decision.context import EngineState, RuleContext
from pipeline.decision.costing import Outcome, rank
from pipeline.decision.evidence import EngineBench, mismatches, required_features
from pipeline.decision.measures import (
    GPU_HOUR_USD,
    MODEL_CHANGES_PER_QUARTER,
    OUTPUT_TOKENS_PER_MONTH,
    SETTING,
    SHARED_PREFIX_RATIO,
)
from pipeline.decision.result import AxisFlip
from pipeline.decision.rules import RULES

# Grid of the search: factors of today's value (×1.1 a step) out to these bounds.
GRID_STEP = 1.1
FACTOR_RANGE = (0.01, 100.0)
# Model changes a quarter searched up to this many (about ten a working day) or 10× today.
CHANGES_MAX = 1_000.0
PREFIX_STEP = 0.01
# The bisection stops when the bracket is this narrow relative to the value (or 1e-6 wide).
RELATIVE_PRECISION = 1e-4
ABSOLUTE_PRECISION = 1e-6

Answer = str | None


def outcome(ctx: RuleContext) -> Outcome:
    """The cost ranking's outcome of a fresh context, the rules run first (their rationale
    entries not kept: only the outcome is read)."""
    ctx.recording = False
    for rule in RULES:
        rule(ctx)
    return rank(ctx)[0]


def answer(ctx: RuleContext) -> Answer:
    """The recommended engine of a fresh context: the rules, then the cost ranking."""
    return outcome(ctx).engine


def moved(
    base: RuleContext,
    *,
    workload: Any = None,
    benches: dict[str, EngineBench] | None = None,
    requirements: Any = None,
) -> RuleContext:
    """A fresh context for re-deciding ``base`` with some of its inputs replaced."""
    req = requirements if requirements is not None else base.requirements
    work = workload if workload is not None else base.workload
    return replace(
        base,
        requirements=req,
        workload=work,
        benches=benches if benches is not None else base.benches,
        required=required_features(req, work),
        states={engine: EngineState() for engine in base.inputs.catalog.engines},
        branch=[],
        pointed={},
        rules=[],
        recording=True,
    )


def axis_flips(ctx: RuleContext, top: Answer, runner: Answer) -> list[AxisFlip]:
    """Every axis's flip (module docstring), today's answer being ``top``."""
    out = [
        *_volume(ctx, top),
        *_changes(ctx, top),
        *_prefix(ctx, top),
        *_gpu_price(ctx, top, runner),
    ]
    if runner is not None:
        out += _own_cost(ctx, top, runner, "down")
    if top is not None:
        out += _own_cost(ctx, top, top, "up")
    return out + _hardware(ctx, top)


def _search(
    at: Callable[[float], Answer], today: float, grid: Sequence[float], today_answer: Answer
) -> tuple[float, Answer] | None:
    """The first value along ``grid`` (ordered away from ``today``) whose answer differs,
    bisected back toward the last value that kept today's answer; None: none differs."""
    seen: dict[float, Answer] = {}

    def decided(value: float) -> Answer:
        if value not in seen:
            seen[value] = at(value)
        return seen[value]

    same = today
    for value in grid:
        if decided(value) == today_answer:
            same = value
            continue
        other = value
        while abs(other - same) > max(
            RELATIVE_PRECISION * max(abs(other), abs(same)), ABSOLUTE_PRECISION
        ):
            middle = (same + other) / 2
            if decided(middle) == today_answer:
                same = middle
            else:
                other = middle
        return other, decided(other)
    return None


def _geometric(start: float, end: float) -> list[float]:
    """Points from ``start`` (excluded) to ``end`` (included), a factor ``GRID_STEP`` apart."""
    steps = math.ceil(abs(math.log(end / start)) / math.log(GRID_STEP))
    factor = GRID_STEP if end > start else 1 / GRID_STEP
    return [start * factor**k for k in range(1, steps)] + [end]


def _axis_flip(
    axis: str,
    metric: str,
    unit: str,
    direction: str,
    today: float,
    at: Callable[[float], Answer],
    grid: Sequence[float],
    top: Answer,
) -> AxisFlip:
    """The flip of one axis in one direction: ``at`` decides with the input at a value,
    ``grid`` walks away from ``today``."""
    found = _search(at, today, grid, top)
    return AxisFlip(
        axis=axis,
        metric=metric,
        unit=unit,
        direction=direction,  # type: ignore[arg-type]
        today=today,
        threshold=None if found is None else found[0],
        engine=None if found is None else found[1],
        searched=sorted([today, grid[-1]]),
    )


def _factor_flips(
    axis: str,
    metric: str,
    unit: str,
    today: float | None,
    at: Callable[[float], Answer],
    top: Answer,
    directions: Sequence[str] = ("up", "down"),
    unknown: str = "",
) -> list[AxisFlip]:
    """Flips of an axis moved by a factor of ``today`` (the metric's value); ``at`` takes
    the factor."""
    if today is None or today <= 0:
        return [_unknown(axis, metric, unit, today, unknown)]
    low, high = FACTOR_RANGE
    return [
        _axis_flip(
            axis,
            metric,
            unit,
            direction,
            today,
            lambda value: at(value / today),
            _geometric(today, today * (high if direction == "up" else low)),
            top,
        )
        for direction in directions
    ]


def _unknown(axis: str, metric: str, unit: str, today: Any, reason: str) -> AxisFlip:
    return AxisFlip(
        axis=axis,
        metric=metric,
        unit=unit,
        direction="change",
        today=today,
        threshold=None,
        engine=None,
        searched=[],
        reason=reason or "today's value is unknown",
    )


def _volume(ctx: RuleContext, top: Answer) -> list[AxisFlip]:
    work = ctx.workload

    def at(k: float) -> Answer:
        return answer(traffic_moved(ctx, k))

    return _factor_flips(
        "volume",
        OUTPUT_TOKENS_PER_MONTH.name,
        "output tokens a month",
        work.output_tokens_per_month,
        at,
        top,
        unknown="the workload's monthly output volume is unknown (no arrival rate or lengths)",
    )


def traffic_moved(ctx: RuleContext, k: float) -> RuleContext:
    """``ctx`` with the traffic × ``k``: arrivals closer in time, so the mean and peak rates
    scale together (and the peak concurrency, by Little's law at the same latency); every
    fleet re-sized in whole replicas at today's capacity per replica."""
    work = ctx.workload
    scaled = replace(
        work,
        mean_rate_rps=_times(work.mean_rate_rps, k),
        peak_rate_rps=_times(work.peak_rate_rps, k),
        peak_concurrency=_times(work.peak_concurrency, k),
    )
    benches = {e: b.rescaled(rate=k) for e, b in ctx.benches.items()}
    return moved(ctx, workload=scaled, benches=benches)


def _times(value: float | None, k: float) -> float | None:
    return None if value is None else value * k


def changes_moved(ctx: RuleContext, per_quarter: float) -> RuleContext:
    """``ctx`` with ``per_quarter`` model changes a quarter."""
    return moved(ctx, requirements=ctx.requirements.replace(model_changes_per_quarter=per_quarter))


def prefix_moved(ctx: RuleContext, share: float) -> RuleContext:
    """``ctx`` with the shared-prefix share the prefix rules read at ``share`` (the costs stay
    today's: the capacity stage priced today's cache hits)."""
    return moved(ctx, workload=replace(ctx.workload, prefix_share=share))


def price_moved(ctx: RuleContext, k: float | dict[str, float]) -> RuleContext:
    """``ctx`` with every engine's $/GPU-hour × ``k`` (a factor by engine when a mapping)."""
    benches = {
        e: b.rescaled(price=k.get(e, 1.0) if isinstance(k, dict) else k)
        for e, b in ctx.benches.items()
    }
    return moved(ctx, benches=benches)


def hardware_moved(ctx: RuleContext, hardware: Sequence[str]) -> RuleContext:
    """``ctx`` with ``requirements.hardware`` replaced: each benchmark re-checked against it."""
    models = tuple(sorted(set(ctx.requirements.models) | set(ctx.workload.models)))
    benches = {
        e: replace(b, mismatches=mismatches(b.gpu_type, b.model, tuple(hardware), models))
        for e, b in ctx.benches.items()
    }
    requirements = ctx.requirements.replace(hardware=tuple(hardware))
    return moved(ctx, requirements=requirements, benches=benches)


def _changes(ctx: RuleContext, top: Answer) -> list[AxisFlip]:
    metric, unit = MODEL_CHANGES_PER_QUARTER.name, "model changes a quarter"
    today = ctx.requirements.model_changes_per_quarter
    if today is None:
        return [
            _unknown(
                "model_changes",
                metric,
                unit,
                None,
                "set requirements.model_changes_per_quarter",
            )
        ]

    def at(n: float) -> Answer:
        return answer(changes_moved(ctx, n))

    up = (
        _geometric(today, max(CHANGES_MAX, today * 10))
        if today
        else [0.1, *_geometric(0.1, CHANGES_MAX)]
    )
    out = [_axis_flip("model_changes", metric, unit, "up", today, at, up, top)]
    if today > 0:  # nothing below none
        down = [*_geometric(today, 0.01), 0.0] if today > 0.01 else [0.0]
        out.append(_axis_flip("model_changes", metric, unit, "down", today, at, down, top))
    return out


def _prefix(ctx: RuleContext, top: Answer) -> list[AxisFlip]:
    metric, unit = SHARED_PREFIX_RATIO.name, "shared-prefix share"
    today = ctx.workload.prefix_share
    if today is None:
        reason = ctx.workload.unknown.get("prefix_share") or "no prefix stage result"
        return [_unknown("prefix_share", metric, unit, None, reason)]

    def at(s: float) -> Answer:
        return answer(prefix_moved(ctx, s))

    steps = round(1 / PREFIX_STEP)
    up = [k * PREFIX_STEP for k in range(steps + 1) if k * PREFIX_STEP > today]
    down = [k * PREFIX_STEP for k in range(steps, -1, -1) if k * PREFIX_STEP < today]
    return [
        _axis_flip("prefix_share", metric, unit, direction, today, at, grid, top)
        for direction, grid in (("up", up), ("down", down))
        if grid  # none past a bound today sits on (no sharing, or all of it)
    ]


def price_reference(ctx: RuleContext, *engines: Answer) -> str | None:
    """The engine whose $/GPU-hour the GPU-price flip is told in: the first of ``engines``
    with a price, else the first benchmarked one with a price."""
    priced = [e for e, b in sorted(ctx.benches.items()) if b.gpu_hour_usd is not None]
    return next((e for e in engines if e in priced), priced[0] if priced else None)


def _gpu_price(ctx: RuleContext, top: Answer, runner: Answer) -> list[AxisFlip]:
    reference = price_reference(ctx, top, runner)
    metric = GPU_HOUR_USD.key(reference) if reference else GPU_HOUR_USD.name

    def at(k: float) -> Answer:
        return answer(price_moved(ctx, k))

    today = ctx.benches[reference].gpu_hour_usd if reference else None
    return _factor_flips(
        "gpu_price",
        metric,
        "$ per GPU-hour",
        today,
        at,
        top,
        unknown="no benchmark with a $/GPU-hour price",
    )


def _own_cost(ctx: RuleContext, top: Answer, engine: str, direction: str) -> list[AxisFlip]:
    bench = ctx.benches.get(engine)
    metric = f"decision.cost_per_1m_output_usd[{engine}]"

    def at(k: float) -> Answer:
        assert bench is not None  # only searched when benchmarked
        return answer(moved(ctx, benches={**ctx.benches, engine: bench.rescaled(cost=k)}))

    return _factor_flips(
        f"cost[{engine}]",
        metric,
        "$ per 1M output tokens",
        bench.cost_per_1m_output_usd if bench else None,
        at,
        top,
        directions=(direction,),
        unknown=f"no cost at the SLO for {ctx.name(engine)} (benchmark it on your traffic)",
    )


def _hardware(ctx: RuleContext, top: Answer) -> list[AxisFlip]:
    metric, unit = SETTING.key("hardware"), "hardware"
    today = list(ctx.requirements.hardware)
    if not today:
        return [_unknown("hardware", metric, unit, today, "set requirements.hardware")]
    changes = [[*today, t] for t in get_args(HardwareTarget) if t not in today]
    if len(today) > 1:
        changes += [[h for h in today if h != t] for t in today]

    def flip(threshold: list[str] | None, engine: Answer) -> AxisFlip:
        return AxisFlip(
            axis="hardware",
            metric=metric,
            unit=unit,
            direction="change",
            today=today,
            threshold=threshold,
            engine=engine,
            searched=changes,
        )

    out = []
    for hardware in changes:
        found = answer(hardware_moved(ctx, hardware))
        if found != top:
            out.append(flip(hardware, found))
    return out or [flip(None, None)]
