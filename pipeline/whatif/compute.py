"""Scenarios and the decision map: the decision (a pure function) re-run on changed inputs.

Every change moves the decision's own view of its inputs, the way the flip search moves one
axis (:mod:`pipeline.decision.flips`): nothing upstream re-runs. How each change is applied
and which are approximations: docs/whatif.md and :data:`HOW`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.costing import Prices
from pipeline.decision.compute import context, decided
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.decision.context import DecisionInputs, RuleContext
from pipeline.decision.evidence import EngineBench
from pipeline.decision.flips import (
    changes_moved,
    hardware_moved,
    moved,
    outcome,
    prefix_moved,
    price_moved,
    traffic_moved,
)
from pipeline.decision.measures import (
    MEAN_RATE,
    MODEL_CHANGES_PER_QUARTER,
    OUTPUT_TOKENS_PER_MONTH,
    PEAK_CONCURRENCY,
    PEAK_RATE,
    SHARED_PREFIX_RATIO,
)
from pipeline.decision.result import DecisionRecord
from pipeline.present.text import money
from pipeline.thresholds import PREFIX_WINDOW_TOKENS
from pipeline.whatif.config import (
    NEW_DEPLOYMENT,
    MapAxis,
    ScenarioChanges,
    WhatifConfig,
)
from pipeline.whatif.result import (
    SCHEMA_VERSION,
    DecisionMap,
    MapAxisValues,
    MapMark,
    ScenarioOutcome,
    WhatifResult,
)

# How each change is applied (the scenario's ``approximations`` say the ones it used).
HOW = {
    "traffic_scale": "traffic: arrivals closer in time, the mean and peak rates and the volume "
    "scaled together, peak concurrency with them (Little's law at today's latency); every fleet "
    "re-sized in whole replicas at today's capacity per replica (the same request mix)",
    "prompt_length_scale": "prompt length: capacity per replica scaled through the capacity "
    "model's split of a replica's busy time at capacity (prefill and cached context grow with "
    "the prompt, decode with the output), to first order; an approximation (attention's cost of "
    "the longer context is not re-fitted); the cached share of the prompt kept",
    "output_length_scale": "output length: as the prompt length, through the decode share; "
    "peak concurrency scaled with the output (a request lasts about its decode time); an "
    "approximation",
    "prefix_share": "shared-prefix share: the value the prefix rules read (the curve's share "
    f"at {PREFIX_WINDOW_TOKENS:,} tokens); the costs stay today's (the capacity stage priced "
    "today's cache hits), an approximation when cache hits would change the capacity",
    "model_changes_per_quarter": "model changes a quarter: the change costs re-counted "
    "(requirements.model_changes_per_quarter)",
    "gpu_price_factor": "GPU price: every engine's $/GPU-hour scaled; fleets unchanged",
    "gpu_hour_usd": "GPU price by type: a benchmark on a GPU type named here takes its price "
    "(matched as bench.prices are); fleets unchanged",
    "hardware": "hardware: requirements.hardware replaced and every benchmark re-checked "
    "against it (the hardware rule excludes engines that cannot run on all of it unless "
    "requirements.one_engine_across_fleet is false)",
    "current_engine": "engine running today: requirements.current_engine replaced (the "
    "payback of a switch re-counted)",
    "slo": "SLO: the bench stage's capacity at the SLO and the capacity stage's search re-run "
    "in memory on the stored load points with these limits (the one change that re-runs "
    "upstream stages); exact as those stages are",
}
# Without the capacity stage's busy-time split, a request's GPU time is taken to grow with
# its output alone (decode-bound).
DECODE_ONLY = (
    "no capacity-stage split of busy time for {engines}: its capacity scaled with the output "
    "length alone (decode-bound)"
)

UNITS = {
    "traffic": "× today's traffic",
    "model_changes": "model changes a quarter",
    "gpu_price": "× today's $/GPU-hour",
    "prefix_share": "shared-prefix share",
}


@dataclass(frozen=True)
class WhatifInputs:
    """Today's decision inputs (the decision stage's) and the team's settings; ``at_slo``: the
    decision inputs re-derived at a scenario's own SLO, by scenario name (the one change that
    re-runs upstream stages: :mod:`pipeline.whatif.stage`)."""

    decision: DecisionInputs
    requirements: Requirements
    settings: DecisionConfig
    at_slo: dict[str, DecisionInputs] = field(default_factory=dict)


def today_context(inputs: WhatifInputs) -> RuleContext:
    """The decision's context before any rule ran, from today's inputs."""
    return context(inputs.decision, inputs.requirements, inputs.settings)


def _busy_factor(bench: EngineBench, prompt: float, output: float) -> float | None:
    """A replica's GPU time per request × this when prompts are × ``prompt`` and outputs ×
    ``output`` (None: no split of busy time to scale by)."""
    cost = bench.workload_cost
    if cost is None:
        return None
    return (cost.prefill_share + cost.cached_context_share) * prompt + cost.decode_share * output


def lengths_moved(ctx: RuleContext, prompt: float, output: float) -> tuple[RuleContext, list[str]]:
    """``ctx`` with prompts × ``prompt`` and outputs × ``output`` (:data:`HOW`), and what was
    approximated beyond it."""
    work = ctx.workload

    def times(value: float | None, k: float) -> float | None:
        return None if value is None else value * k

    workload = replace(
        work,
        prompt_p50=times(work.prompt_p50, prompt),
        prompt_p99=times(work.prompt_p99, prompt),
        prompt_mean=times(work.prompt_mean, prompt),
        output_p50=times(work.output_p50, output),
        output_p99=times(work.output_p99, output),
        output_mean=times(work.output_mean, output),
        peak_concurrency=times(work.peak_concurrency, output),
    )
    benches, decode_only = {}, []
    for engine, bench in ctx.benches.items():
        busy = _busy_factor(bench, prompt, output)
        if busy is None:
            busy = output
            decode_only.append(ctx.name(engine))
        scaled = bench.rescaled(cost=busy)
        per_1m = scaled.cost_per_1m_output_usd
        # rescaled() keeps output tokens per request; here they change too.
        benches[engine] = replace(
            scaled, cost_per_1m_output_usd=None if per_1m is None else per_1m / output
        )
    notes = [DECODE_ONLY.format(engines=", ".join(decode_only))] if decode_only else []
    return moved(ctx, workload=workload, benches=benches), notes


def _price_factors(ctx: RuleContext, changes: ScenarioChanges) -> dict[str, float]:
    """Each engine's $/GPU-hour factor: the scenario's price for its GPU type, else its
    factor."""
    prices = Prices(gpu_hour_usd=changes.gpu_hour_usd)
    factors = {}
    for engine, bench in ctx.benches.items():
        factor = changes.gpu_price_factor or 1.0
        price, _ = prices.price_for(bench.gpu_type, None)
        if price is not None and bench.gpu_hour_usd:
            factor = price / bench.gpu_hour_usd
        factors[engine] = factor
    return factors


def changed(base: RuleContext, changes: ScenarioChanges) -> tuple[RuleContext, list[str]]:
    """A fresh context with ``changes`` applied to ``base``'s inputs, and how each was applied
    (:data:`HOW`, plus what was approximated)."""
    ctx, notes = base, []
    given = changes.model_dump(exclude_defaults=True)
    if changes.hardware is not None:
        ctx = hardware_moved(ctx, changes.hardware)
    if changes.current_engine is not None:
        engine = None if changes.current_engine == NEW_DEPLOYMENT else changes.current_engine
        ctx = moved(ctx, requirements=ctx.requirements.replace(current_engine=engine))
    if changes.model_changes_per_quarter is not None:
        ctx = changes_moved(ctx, changes.model_changes_per_quarter)
    if changes.traffic_scale is not None:
        ctx = traffic_moved(ctx, changes.traffic_scale)
    if changes.prompt_length_scale is not None or changes.output_length_scale is not None:
        ctx, approximated = lengths_moved(
            ctx, changes.prompt_length_scale or 1.0, changes.output_length_scale or 1.0
        )
        notes += approximated
    if changes.prefix_share is not None:
        ctx = prefix_moved(ctx, changes.prefix_share)
    if changes.gpu_price_factor is not None or changes.gpu_hour_usd:
        ctx = price_moved(ctx, _price_factors(ctx, changes))
    return moved(ctx), [HOW[key] for key in given] + notes


def _recommended_costs(record: DecisionRecord) -> tuple[float | None, float | None]:
    engine = record.recommendation.engine
    found = [c for c in record.candidates if c.engine == engine]
    return (found[0].monthly_cost_usd, found[0].monthly_total_usd) if found else (None, None)


def _recommended_band(record: DecisionRecord) -> tuple[float, float] | None:
    """The recommended engine's GPU fleet a month at its capacity band's ends (None: none)."""
    engine = record.recommendation.engine
    found = [c for c in record.candidates if c.engine == engine]
    return found[0].monthly_cost_band_usd if found else None


def _against_today(today: DecisionRecord, then: DecisionRecord) -> list[str]:
    """What differs between today's record and a scenario's, a sentence each."""
    a, b = today.recommendation, then.recommendation
    out = []

    def said(value: Any) -> str:
        return "none" if value is None else str(value)

    if a.engine != b.engine:
        out.append(f"engine: {said(a.engine_name)} → {said(b.engine_name)}")
    if a.runner_up != b.runner_up:
        names = {c.engine: c.name for c in [*today.candidates, *then.candidates]}
        before, after = (names.get(e) if e else None for e in (a.runner_up, b.runner_up))
        out.append(f"runner-up: {said(before)} → {said(after)}")
    if a.routing_layer != b.routing_layer:
        out.append(f"routing layer: {said(a.routing_layer)} → {said(b.routing_layer)}")
    if a.confidence != b.confidence:
        out.append(f"confidence: {a.confidence} → {b.confidence}")
    costs = _recommended_costs(today)[0], _recommended_costs(then)[0]
    if costs[0] != costs[1]:
        out.append(
            "monthly GPU cost: "
            + " → ".join(money(v) if v is not None else "unknown" for v in costs)
        )
    return out


def scenario(
    name: str, base: RuleContext, today: DecisionRecord, changes: ScenarioChanges
) -> tuple[ScenarioOutcome, DecisionRecord]:
    """One scenario's outcome and its full decision record."""
    ctx, notes = changed(base, changes)
    record = decided(ctx)
    rec = record.recommendation
    gpu, total = _recommended_costs(record)
    return (
        ScenarioOutcome(
            name=name,
            changes=changes.model_dump(mode="json", exclude_defaults=True),
            engine=rec.engine,
            engine_name=rec.engine_name,
            runner_up=rec.runner_up,
            runner_up_name=next(
                (c.name for c in record.candidates if c.engine == rec.runner_up), None
            ),
            routing_layer=rec.routing_layer,
            confidence=rec.confidence,
            monthly_cost_usd=gpu,
            monthly_cost_band_usd=_recommended_band(record),
            monthly_total_usd=total,
            headline=rec.headline,
            against_today=_against_today(today, record),
            approximations=notes,
        ),
        record,
    )


def _axis_mover(axis: str) -> Callable[[RuleContext, float], RuleContext]:
    """How a map axis moves a context to one of its values."""
    movers: dict[str, Callable[[RuleContext, float], RuleContext]] = {
        "traffic": traffic_moved,
        "model_changes": changes_moved,
        "gpu_price": price_moved,
        "prefix_share": prefix_moved,
    }
    return movers[axis]


def axis_today(ctx: RuleContext, axis: str) -> float | None:
    """Where today sits on ``axis``: 1 for a factor axis, else today's value."""
    if axis in ("traffic", "gpu_price"):
        return 1.0
    if axis == "model_changes":
        return ctx.requirements.model_changes_per_quarter
    return ctx.workload.prefix_share


# A flip's axis in the record → the map axis it lies on, and whether its threshold is a
# factor of today's value there.
FLIP_AXES = {
    "volume": ("traffic", True),
    "gpu_price": ("gpu_price", True),
    "model_changes": ("model_changes", False),
    "prefix_share": ("prefix_share", False),
}
# A trigger's metric → the map axis it lies on, and whether it scales with that axis as a
# factor (peak concurrency and the rates scale with the traffic).
TRIGGER_AXES = {
    OUTPUT_TOKENS_PER_MONTH.name: "traffic",
    MEAN_RATE.name: "traffic",
    PEAK_RATE.name: "traffic",
    PEAK_CONCURRENCY.name: "traffic",
    MODEL_CHANGES_PER_QUARTER.name: "model_changes",
    SHARED_PREFIX_RATIO.name: "prefix_share",
}


def _marks(today: DecisionRecord, axes: dict[str, str]) -> list[MapMark]:
    """Today's flips and triggers that fall on the map's axes (``axes``: map axis → "x"/"y"),
    at their value on that axis."""
    out = []
    for flip in today.flips:
        axis, factor = FLIP_AXES.get(flip.axis, (None, False))
        if axis not in axes or not isinstance(flip.threshold, int | float):
            continue
        if factor and not flip.today:
            continue
        value = flip.threshold / flip.today if factor else float(flip.threshold)
        out.append(
            MapMark(
                kind="flip",
                id=f"{flip.axis}.{flip.direction}",
                axis=axes[axis],
                value=value,
                engine=flip.engine,
                text=f"{flip.axis} {flip.direction}: {flip.engine or 'none'} past {value:.4g}",
            )
        )
    for trig in today.triggers:
        axis = TRIGGER_AXES.get(trig.metric)
        if axis not in axes or not isinstance(trig.threshold, int | float):
            continue
        if trig.id.startswith("flip."):
            continue  # a flip's own trigger: the flip is marked
        now = today.measured(trig.metric)
        if axis == "traffic":
            if not isinstance(now, int | float) or not now:
                continue
            value = trig.threshold / now
        else:
            value = float(trig.threshold)
        out.append(
            MapMark(
                kind="trigger",
                id=trig.id,
                axis=axes[axis],
                value=value,
                engine=None,
                text=f"{trig.id}: {trig.metric} {trig.comparator} {trig.threshold}",
            )
        )
    return out


def decision_map(
    base: RuleContext, today: DecisionRecord, x_axis: MapAxis, y_axis: MapAxis
) -> DecisionMap:
    """The decision over the grid of ``x_axis`` × ``y_axis``, each cell its winning engine and
    whether the top two tie. The x move is made once a column, the y move on it a cell."""
    move_x, move_y = _axis_mover(x_axis.axis), _axis_mover(y_axis.axis)
    xs, ys = x_axis.values(), y_axis.values()
    cells: list[list[str | None]] = [[None] * len(xs) for _ in ys]
    ties = [[False] * len(xs) for _ in ys]
    for i, x in enumerate(xs):
        column = move_x(base, x)
        for j, y in enumerate(ys):
            found = outcome(move_y(column, y))
            cells[j][i] = found.engine
            ties[j][i] = found.confidence == "tie"
    seen = sorted({e for row in cells for e in row if e} | {today.recommendation.engine or ""})
    return DecisionMap(
        x=_axis_values(base, x_axis, xs),
        y=_axis_values(base, y_axis, ys),
        engines={e: base.name(e) for e in seen if e},
        cells=cells,
        ties=ties,
        today_engine=today.recommendation.engine,
        marks=_marks(today, {x_axis.axis: "x", y_axis.axis: "y"}),
        decisions=len(xs) * len(ys),
    )


def _axis_values(base: RuleContext, axis: MapAxis, values: list[float]) -> MapAxisValues:
    return MapAxisValues(
        axis=axis.axis,
        unit=UNITS[axis.axis],
        log=axis.log,
        values=values,
        today=axis_today(base, axis.axis),
    )


def _base_of(inputs: WhatifInputs, name: str, today: RuleContext) -> RuleContext:
    """The context scenario ``name`` starts from: today's, or at its own SLO."""
    found = inputs.at_slo.get(name)
    return today if found is None else context(found, inputs.requirements, inputs.settings)


def whatif(
    inputs: WhatifInputs,
    config: WhatifConfig,
    *,
    only: str | None = None,
    pair: tuple[MapAxis, MapAxis] | None = None,
    with_map: bool = True,
) -> WhatifResult:
    """Today's decision, each named scenario (``only``: that one) and the map over ``pair``
    (default: the configured x and y)."""
    base = today_context(inputs)
    today = decided(moved(base))
    names = [only] if only is not None else sorted(config.scenarios)
    outcomes = [
        scenario(n, _base_of(inputs, n, base), today, config.scenarios[n])[0] for n in names
    ]
    x_axis, y_axis = pair or (config.map.x, config.map.y)
    gpu, _ = _recommended_costs(today)
    return WhatifResult(
        schema_version=SCHEMA_VERSION,
        workload=today.workload,
        today_engine=today.recommendation.engine,
        today_confidence=today.recommendation.confidence,
        today_monthly_cost_usd=gpu,
        today_monthly_cost_band_usd=_recommended_band(today),
        scenarios=outcomes,
        map=decision_map(base, today, x_axis, y_axis) if with_map else None,
    )
