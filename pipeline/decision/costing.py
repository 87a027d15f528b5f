"""Cost at the SLO, the margin, and the payback of switching: which benchmarked engine is
cheapest in total (GPU fleet at the peak rate plus the recurring cost of model changes), when
a gap is a tie, when a switch does not pay back, and what would flip the answer.

The ranking works in codes and numbers (:class:`Finding`); :mod:`pipeline.decision.present`
phrases them, so the wording can change without touching a comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.decision.context import HOURS_PER_WEEK, Finding, RuleContext, current_engine
from pipeline.decision.present import finding_text


def deployment_backend(ctx: RuleContext, engine: str) -> str | None:
    """The serving backend ``engine``'s benchmark manifest names (None: not said or not
    benchmarked)."""
    bench = ctx.benches.get(engine)
    return bench.backend if bench is not None else None


def _migration_weeks(ctx: RuleContext, engine: str) -> float:
    override = {
        ctx.catalog.require_engine(k, f"requirements.migration_engineer_weeks.{k}"): v
        for k, v in ctx.requirements.migration_engineer_weeks.items()
    }
    if engine in override:
        return override[engine]
    return ctx.catalog.engines[engine].migration_weeks(deployment_backend(ctx, engine))


def switch_cost(ctx: RuleContext, engine: str) -> float | None:
    if engine == current_engine(ctx):
        return 0.0
    week = ctx.requirements.engineer_week_usd
    return None if week is None else _migration_weeks(ctx, engine) * week


def _change_cost_per_change(ctx: RuleContext, engine: str) -> float | None:
    """People's time plus GPU build time for one model or configuration change, on the
    backend the deployment runs; None when that cost depends on a backend nobody named."""
    week = ctx.requirements.engineer_week_usd
    change = ctx.catalog.engines[engine].change_cost(deployment_backend(ctx, engine))
    if change is None:
        return None
    bench = ctx.benches.get(engine)
    gpu_usd = 0.0
    if change.build_minutes:
        if bench is None or bench.gpu_hour_usd is None or bench.gpu_count is None:
            return None
        gpu_usd = change.build_minutes / 60 * bench.gpu_count * bench.gpu_hour_usd
    if week is None:
        return None if change.engineer_hours else gpu_usd
    return change.engineer_hours / HOURS_PER_WEEK * week + gpu_usd


def _monthly_change_cost(ctx: RuleContext, engine: str) -> float | None:
    per_quarter = ctx.requirements.model_changes_per_quarter
    per_change = _change_cost_per_change(ctx, engine)
    if per_quarter is None or per_change is None:
        return None
    return per_quarter / 3 * per_change


@dataclass(frozen=True)
class Priced:
    engine: str
    cost_per_1m: float | None
    monthly_gpu: float | None
    monthly_change: float | None

    def value(self, basis: str) -> float | None:
        return {
            "monthly_total_usd": self.monthly_total,
            "monthly_gpu_usd": self.monthly_gpu,
            "cost_per_1m_output_usd": self.cost_per_1m,
        }[basis]

    @property
    def monthly_total(self) -> float | None:
        if self.monthly_gpu is None or self.monthly_change is None:
            return None
        return self.monthly_gpu + self.monthly_change


def price_of(ctx: RuleContext, engine: str) -> Priced:
    bench = ctx.benches.get(engine)
    return Priced(
        engine,
        bench.cost_per_1m_output_usd if bench else None,
        bench.monthly_gpu_usd if bench else None,
        _monthly_change_cost(ctx, engine),
    )


def payback_months(ctx: RuleContext, engine: str) -> float | None:
    """Months for switching from the engine running today to ``engine`` to pay for itself
    (None when nothing runs today, it is that engine, or a cost is unknown; inf when it never
    saves)."""
    current = current_engine(ctx)
    switch = switch_cost(ctx, engine)
    if current is None or current == engine or switch is None:
        return None
    here, there = _monthly(price_of(ctx, current)), _monthly(price_of(ctx, engine))
    if here is None or there is None:
        return None
    return switch / (here - there) if here > there else math.inf


def _monthly(price: Priced) -> float | None:
    return price.monthly_total if price.monthly_total is not None else price.monthly_gpu


def _basis(priced: list[Priced]) -> tuple[str, dict[str, float]]:
    """What the ranking compares: monthly totals when every priced engine has one, else
    monthly GPU cost, else cost per 1M output tokens."""
    for basis in ("monthly_total_usd", "monthly_gpu_usd"):
        values = {p.engine: p.value(basis) for p in priced}
        known = {e: v for e, v in values.items() if v is not None}
        if known and len(known) == len(values):
            return basis, known
    return "cost_per_1m_output_usd", {
        p.engine: p.cost_per_1m for p in priced if p.cost_per_1m is not None
    }


@dataclass(frozen=True)
class Flip:
    """What would make an engine the answer (``condition``), and when measurable, the metric
    and the threshold a revisit trigger watches (``threshold`` None: not measurable yet)."""

    condition: Finding
    metric: str
    comparator: str
    threshold: float | None


@dataclass
class Outcome:
    engine: str | None
    runner_up: str | None
    confidence: str
    reasons: list[str]
    basis: str | None
    values: dict[str, float]
    flips: dict[str, Flip]


def _tie_key(ctx: RuleContext, engine: str) -> tuple[Any, ...]:
    """Maintenance trajectory, then migration cost: active before maintenance, the engine
    running today, fewer migration weeks, the decision tree's order, then more releases (a
    noisy proxy of cadence, so last)."""
    spec = ctx.catalog.engines[engine]
    order = ctx.branch.index(engine) if engine in ctx.branch else len(ctx.branch)
    return (
        spec.status.state != "active",
        engine != current_engine(ctx),
        _migration_weeks(ctx, engine),
        order,
        -spec.releases_last_6_months.count,
        engine,
    )


def _preference(ctx: RuleContext) -> list[str]:
    """The viable engines the decision tree points to, in its order. Engines it does not
    point to are never recommended on the tree's say-so alone (only a cheaper measured cost
    can bring them in)."""
    viable = ctx.viable()
    return [e for e in ctx.branch if e in viable]


TIE_BREAKS = (
    "maintained",
    "runs_today",
    "shorter_migration",
    "tree_order",
    "releases",
    "alphabetical",
)  # the criteria of _tie_key, in its order


def _tie_break(ctx: RuleContext, first: str, second: str) -> tuple[str, ...]:
    """The tie-break criterion that separated the two engines, why the decision tree points
    to each ('' where it does not), then the criteria on which they were equal."""
    a, b = _tie_key(ctx, first), _tie_key(ctx, second)
    index = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), 99)
    index = min(index, len(TIE_BREAKS) - 1)
    why = (ctx.pointed.get(first, ""), ctx.pointed.get(second, ""))
    return (TIE_BREAKS[index], *why, *TIE_BREAKS[:index])


def _tie_figures(ctx: RuleContext, first: str, second: str) -> dict[str, float]:
    """What the tie-break compared: migration engineer-weeks and releases in six months."""
    releases = [ctx.catalog.engines[e].releases_last_6_months.count for e in (first, second)]
    return {
        "first_weeks": _migration_weeks(ctx, first),
        "second_weeks": _migration_weeks(ctx, second),
        "first_releases": releases[0],
        "second_releases": releases[1],
    }


def _cost_rule(
    ctx: RuleContext, source: str, fired: bool | None, effect: Finding, **evidence: Any
) -> None:
    ctx.rule("cost", "Cost at the SLO", source, fired, finding_text(effect, ctx.name), **evidence)


def choose(ctx: RuleContext) -> Outcome:
    """The cost ranking and payback, with its reasons and flips phrased for the record."""
    outcome, reasons = _rank(ctx)
    outcome.reasons = [finding_text(r, ctx.name) for r in reasons]
    return outcome


def _rank(ctx: RuleContext) -> tuple[Outcome, list[Finding]]:
    preference = _preference(ctx)
    reasons: list[Finding] = []
    flips: dict[str, Flip] = {}
    margin = ctx.requirements.cost_margin
    relevant = {e: b for e, b in ctx.benches.items() if not b.mismatches and e in ctx.viable()}
    priced = [
        price_of(ctx, e)
        for e in [*preference, *sorted(set(relevant) - set(preference))]
        if e in relevant and relevant[e].cost_per_1m_output_usd is not None
    ]
    for engine, bench in sorted(ctx.benches.items()):
        if bench.mismatches:
            reasons.append(Finding("bench_mismatch", (engine,), details=tuple(bench.mismatches)))
    if not preference and not priced:
        excluded = {e: s.excluded[0] for e, s in ctx.states.items() if s.excluded}
        _cost_rule(
            ctx,
            "docs/decision-rules.md#cost",
            None,
            Finding("no_candidate"),
            excluded=excluded,
        )
        found = Finding("no_candidate", tuple(excluded), details=tuple(excluded.values()))
        return Outcome(None, None, "provisional", [], None, {}, {}), [found]
    if not priced:
        top = preference[0]
        runner = preference[1] if len(preference) > 1 else None
        unpriced = [b.cost_note for b in relevant.values() if b.cost_basis == "workload"]
        missing = ctx.inputs.missing.get("bench") or next(filter(None, unpriced), "")
        engines = (top,) if runner is None else (top, runner)
        reasons.append(Finding("no_benchmark", engines, details=(missing,)))
        _cost_rule(
            ctx,
            "docs/decision-rules.md#cost",
            None,
            Finding("cost_unmeasured", details=(missing,)),
            decision_tree=preference,
        )
        if runner:
            flips[runner] = Flip(
                Finding("measured_cheaper", (runner, top), {"margin": margin}),
                f"decision.cost_per_1m_output_usd[{runner}]",
                "<",
                None,
            )
        top, runner = _payback(ctx, top, runner, reasons, flips)
        return Outcome(top, runner, "provisional", [], None, {}, flips), reasons

    basis, values = _basis(priced)
    ranked = sorted(values, key=lambda e: (values[e], _tie_key(ctx, e)))
    top = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    confidence = "firm"
    tie: Finding | None = None
    if runner is not None:
        gap = (values[runner] - values[top]) / values[top] if values[top] else math.inf
        if gap < margin:
            confidence = "tie"
            first, second = sorted((top, runner), key=lambda e: _tie_key(ctx, e))
            tie = Finding(
                "tie",
                (top, runner, first, second),
                {"gap": gap, "margin": margin, **_tie_figures(ctx, first, second)},
                (basis, *_tie_break(ctx, first, second)),
            )
            reasons.append(tie)
            top, runner = first, second
    _cost_rule(
        ctx,
        "docs/decision-rules.md#cost",
        True,
        Finding(
            "only_cost" if len(values) == 1 else "lowest_tie" if tie else "lowest",
            (top,),
            details=(basis,),
        ),
        basis=basis,
        values=values,
        cost_per_1m_output_usd={p.engine: p.cost_per_1m for p in priced},
        monthly_gpu_usd={p.engine: p.monthly_gpu for p in priced},
        monthly_change_usd={p.engine: p.monthly_change for p in priced},
    )
    ctx.rule(
        "margin",
        "A difference larger than the margin",
        "docs/decision-rules.md#tie",
        tie is not None if runner else None,
        finding_text(
            Finding("margin_tie", tie.engines, tie.figures, tie.details)
            if tie
            else Finding("no_runner_up" if runner is None else "margin_exceeded"),
            ctx.name,
        ),
        margin=margin,
    )
    # The decision tree's first choice without a cost leaves the question open.
    favourite = preference[0] if preference else top
    if favourite not in values and favourite != top:
        confidence = "provisional" if confidence == "firm" else confidence
        measured = favourite in ctx.benches and not ctx.benches[favourite].mismatches
        reasons.append(
            Finding("favourite_unpriced" if measured else "favourite_unbenchmarked", (favourite,))
        )
        flips[favourite] = _favourite_flip(ctx, favourite, top)
        runner = favourite if runner is None or runner not in preference[:2] else runner
    top, runner = _payback(ctx, top, runner, reasons, flips)
    if runner is not None and runner in values and runner not in flips:
        flips[runner] = _flip(ctx, top, runner, values, basis)
    return Outcome(top, runner, confidence, [], basis, values, flips), reasons


def _favourite_flip(ctx: RuleContext, favourite: str, top: str) -> Flip:
    """The cost per 1M output tokens at which the unbenchmarked favourite would win by the
    margin. Both sides per token (its fleet cannot be sized without its capacity): cost per 1M
    plus model-change cost spread over the monthly volume, when both are known."""
    margin = ctx.requirements.cost_margin
    keep = 1 - margin
    top_cost = ctx.benches[top].cost_per_1m_output_usd
    volume = ctx.workload.output_tokens_per_month
    change, top_change = _monthly_change_cost(ctx, favourite), _monthly_change_cost(ctx, top)
    metric = f"decision.cost_per_1m_output_usd[{favourite}]"
    engines = (favourite, top)
    if top_cost is None:
        return Flip(Finding("cost_below_rival", engines, {"margin": margin}), metric, "<", None)
    if volume and change is not None and top_change is not None and change != top_change:
        # c_f + change_f/V ≤ keep × (c_t + change_t/V), per 1M output tokens.
        threshold = keep * top_cost + (keep * top_change - change) * 1e6 / volume
        changes = {"change": change, "rival_change": top_change}
        if threshold <= 0:
            return Flip(
                Finding("changes_too_dear", engines, changes),
                "requirements.model_changes_per_quarter",
                "<",
                ctx.requirements.model_changes_per_quarter,
            )
        figures = {"threshold": threshold, "margin": margin, "rival_cost": top_cost, **changes}
        return Flip(Finding("cost_below_per_token", engines, figures), metric, "<", threshold)
    below = top_cost * keep
    figures = {"margin": margin, "rival_cost": top_cost, "threshold": below}
    return Flip(Finding("cost_below_margin", engines, figures), metric, "<", below)


# The ranking's figures as the record measures them: the workload's own where the capacity
# stage knows them, else the benchmark's (``decision.cost_basis[engine]`` says which).
BASIS_METRICS = {
    "monthly_total_usd": "decision.monthly_total_usd",
    "monthly_gpu_usd": "decision.monthly_gpu_usd",
    "cost_per_1m_output_usd": "decision.cost_per_1m_output_usd",
}


def _flip(ctx: RuleContext, top: str, runner: str, values: dict[str, float], basis: str) -> Flip:
    """The condition under which the runner-up would win by more than the margin, computed
    from the numbers: fewer model changes when it loses only on change cost, else a lower
    measured cost."""
    margin = ctx.requirements.cost_margin
    keep = 1 - margin
    top_price, run_price = price_of(ctx, top), price_of(ctx, runner)
    per_quarter = ctx.requirements.model_changes_per_quarter
    top_change, run_change = _change_cost_per_change(ctx, top), _change_cost_per_change(ctx, runner)
    if (
        top_price.monthly_gpu is not None
        and run_price.monthly_gpu is not None
        and top_change is not None
        and run_change is not None
        and per_quarter is not None
    ):
        # run_gpu + n/3 × run_change ≤ keep × (top_gpu + n/3 × top_change), solved for n.
        slack = keep * top_price.monthly_gpu - run_price.monthly_gpu
        extra = run_change - keep * top_change
        if slack > 0 and extra > 0:
            n = math.floor(3 * slack / extra * 10) / 10
            figures = {"changes": n, "changes_today": per_quarter}
            figures |= _volume_flip(ctx, top_price, run_price, keep)
            return Flip(
                Finding("fewer_changes", (runner, top), figures),
                "requirements.model_changes_per_quarter",
                "<=",
                n,
            )
    threshold = values[top] * keep
    figures = {
        "threshold": threshold,
        "margin": margin,
        "rival_value": values[top],
        "value": values[runner],
    }
    return Flip(
        Finding("basis_below", (runner, top), figures, (basis,)),
        f"{BASIS_METRICS[basis]}[{runner}]",
        "<",
        threshold,
    )


def _volume_flip(ctx: RuleContext, top: Priced, runner: Priced, keep: float) -> dict[str, float]:
    """The monthly output-token volume above which a cheaper per-token runner-up's GPU saving
    outweighs its higher change cost (fleet granularity aside), and today's; empty when none."""
    volume = ctx.workload.output_tokens_per_month
    if (
        volume is None
        or top.cost_per_1m is None
        or runner.cost_per_1m is None
        or top.monthly_change is None
        or runner.monthly_change is None
    ):
        return {}
    per_token_gain = (keep * top.cost_per_1m - runner.cost_per_1m) / 1e6
    extra = runner.monthly_change - keep * top.monthly_change
    if per_token_gain <= 0 or extra <= 0:
        return {}
    return {"volume": extra / per_token_gain, "volume_today": volume}


def _payback(
    ctx: RuleContext,
    top: str,
    runner: str | None,
    reasons: list[Finding],
    flips: dict[str, Flip],
) -> tuple[str, str | None]:
    """Whether switching from the engine running today to ``top`` pays back; the engine that
    stays (and the runner-up) when it does not."""
    current = current_engine(ctx)
    limit = ctx.settings.payback_max_months

    def rule(fired: bool | None, effect: Finding, **evidence: Any) -> None:
        ctx.rule(
            "payback",
            "Payback of switching from the engine running today",
            "docs/decision-rules.md#payback",
            fired,
            finding_text(effect, ctx.name),
            **evidence,
        )

    if current is None:
        rule(None, Finding("nothing_runs"))
        return top, runner
    if current == top:
        rule(False, Finding("current_stays", (current,)))
        return top, runner
    switch = switch_cost(ctx, top)
    if ctx.states[current].excluded:
        figures = {} if switch is None else {"switch": switch}
        excluded = tuple(ctx.states[current].excluded)
        rule(
            False,
            Finding("current_excluded", (current, top), figures, excluded),
            switch_cost_usd=switch,
        )
        return top, runner
    top_month = _monthly(price_of(ctx, top))
    current_month = _monthly(price_of(ctx, current))
    if switch is None or top_month is None or current_month is None:
        # What to supply: the price of a week, else a monthly cost of the engine running today.
        missing = "engineer_week_usd" if switch is None else "current_monthly_cost"
        reasons.append(Finding("payback_unknown", (current, top), details=(missing,)))
        rule(
            None,
            Finding("payback_unknown_rule", (current, top), details=(missing,)),
            switch_cost_usd=switch,
        )
        flips[top] = Flip(
            Finding("payback_shown", (top, current), {"limit": limit}, (missing,)),
            f"decision.payback_months[{top}]",
            "<=",
            limit,
        )
        return current, top
    saving = current_month - top_month
    months = switch / saving if saving > 0 else math.inf
    figures = {"saving": saving, "switch": switch, "months": months, "limit": limit}
    evidence = {
        "switch_cost_usd": switch,
        "monthly_saving_usd": saving,
        "payback_months": months,
        "limit_months": limit,
    }
    if months > limit:
        rule(True, Finding("payback_too_long_rule", (top, current), figures), **evidence)
        reasons.append(Finding("payback_too_long", (top, current), figures))
        flips[top] = Flip(
            Finding("saving_needed", (top,), {"needed": switch / limit, **figures}),
            f"decision.payback_months[{top}]",
            "<=",
            limit,
        )
        return current, top
    rule(False, Finding("pays_back", (top,), figures), **evidence)
    return top, runner
