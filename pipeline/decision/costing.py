"""Cost at the SLO, the margin, and the payback of switching: which benchmarked engine is
cheapest in total (GPU fleet at the peak rate plus the recurring cost of model changes), when
a gap is a tie, when a switch does not pay back, and what would flip the answer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.decision.context import HOURS_PER_WEEK, RuleContext, current_engine, money, usd


def _migration_weeks(ctx: RuleContext, engine: str) -> float:
    override = {
        ctx.catalog.require_engine(k, f"requirements.migration_engineer_weeks.{k}"): v
        for k, v in ctx.requirements.migration_engineer_weeks.items()
    }
    return override.get(engine, ctx.catalog.engines[engine].migration_engineer_weeks.value)


def switch_cost(ctx: RuleContext, engine: str) -> float | None:
    if engine == current_engine(ctx):
        return 0.0
    week = ctx.requirements.engineer_week_usd
    return None if week is None else _migration_weeks(ctx, engine) * week


def _change_cost_per_change(ctx: RuleContext, engine: str) -> float | None:
    """People's time plus GPU build time for one model or configuration change."""
    week = ctx.requirements.engineer_week_usd
    change = ctx.catalog.engines[engine].change
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


@dataclass
class Outcome:
    engine: str | None
    runner_up: str | None
    confidence: str
    reasons: list[str]
    basis: str | None
    values: dict[str, float]
    flips: dict[str, Flip]


@dataclass(frozen=True)
class Flip:
    """What would make ``engine`` the answer: prose, and when measurable, the metric and the
    threshold a revisit trigger watches (``threshold`` None: not measurable yet)."""

    text: str
    metric: str
    comparator: str
    threshold: float | None


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


def _no_candidate(ctx: RuleContext, reason: str) -> Outcome:
    excluded = {e: s.excluded[0] for e, s in ctx.states.items() if s.excluded}
    ctx.rule(
        "cost",
        "Cost at the SLO",
        "DOMAIN.md: cost per 1M tokens at your SLO",
        None,
        reason,
        excluded=excluded,
    )
    why = "; ".join(f"{ctx.name(e)}: {r}" for e, r in excluded.items())
    return Outcome(
        None, None, "provisional", [f"{reason} ({why})" if why else reason], None, {}, {}
    )


def _tie_reason(ctx: RuleContext, first: str, second: str) -> str:
    """Which of the tie-break criteria separated the two engines."""
    a, b = _tie_key(ctx, first), _tie_key(ctx, second)
    words = (
        "it is actively maintained",
        "it runs today",
        f"its migration is shorter ({_migration_weeks(ctx, first):g} vs "
        f"{_migration_weeks(ctx, second):g} engineer-weeks)",
        "the decision tree points to it first",
        "it releases more often",
        "alphabetical order (nothing else separates them)",
    )
    index = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(words) - 1)
    return words[min(index, len(words) - 1)]


def choose(ctx: RuleContext) -> Outcome:
    preference = _preference(ctx)
    reasons: list[str] = []
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
            reasons.append(
                f"{ctx.name(engine)}'s benchmark is not about your deployment "
                f"({'; '.join(bench.mismatches)}): its cost is not used"
            )
    if not preference and not priced:
        return _no_candidate(ctx, "no engine the decision tree points to meets the requirements")
    if not priced:
        top = preference[0]
        runner = preference[1] if len(preference) > 1 else None
        reason = (
            ctx.inputs.missing.get("bench")
            or "no benchmark with a cost at the SLO for a viable engine on your deployment"
        )
        reasons.append(
            f"no benchmark on this traffic ({reason}): run an open-loop benchmark of {ctx.name(top)}"
            + (f" and {ctx.name(runner)}" if runner else "")
        )
        ctx.rule(
            "cost",
            "Cost at the SLO",
            "DOMAIN.md: every branch ends in your own open-loop benchmark",
            None,
            f"unknown: {reason}; the decision tree's choice stands",
            decision_tree=preference,
        )
        if runner:
            flips[runner] = Flip(
                f"{ctx.name(runner)} wins if its measured cost per 1M output tokens at the SLO is "
                f"more than {margin:.0%} below {ctx.name(top)}'s on your traffic",
                f"bench.cost_per_1m_output_usd[{runner}]",
                "<",
                None,
            )
        top, runner = _payback(ctx, top, runner, {}, "cost_per_1m_output_usd", reasons, flips)
        return Outcome(top, runner, "provisional", reasons, None, {}, flips)

    basis, values = _basis(priced)
    ranked = sorted(values, key=lambda e: (values[e], _tie_key(ctx, e)))
    top = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    confidence = "firm"
    tied = False
    if runner is not None:
        gap = (values[runner] - values[top]) / values[top] if values[top] else math.inf
        if gap < margin:
            tied = True
            confidence = "tie"
            first, second = sorted((top, runner), key=lambda e: _tie_key(ctx, e))
            reasons.append(
                f"{ctx.name(top)} and {ctx.name(runner)} are within {gap:.1%} on "
                f"{BASIS_WORDS[basis]} (under the {margin:.0%} margin): {ctx.name(first)} is "
                f"chosen because {_tie_reason(ctx, first, second)}"
            )
            top, runner = first, second
    lowest = (
        f"{ctx.name(top)} has the lowest {BASIS_WORDS[basis]}"
        if len(values) > 1
        else f"{ctx.name(top)} is the only engine with a cost at the SLO on your deployment"
    )
    ctx.rule(
        "cost",
        "Cost at the SLO",
        "DOMAIN.md: compare cost per 1M tokens at your SLO, not peak throughput",
        True,
        lowest + (" (tie)" if tied else ""),
        basis=basis,
        values=values,
        cost_per_1m_output_usd={p.engine: p.cost_per_1m for p in priced},
        monthly_gpu_usd={p.engine: p.monthly_gpu for p in priced},
        monthly_change_usd={p.engine: p.monthly_change for p in priced},
    )
    ctx.rule(
        "margin",
        "A difference larger than the margin",
        "DOMAIN.md: a re-benchmark changes the ranking by more than the noise",
        tied if runner else None,
        "tie: " + reasons[-1]
        if tied
        else ("no runner-up with a cost" if runner is None else "the gap exceeds the margin"),
        margin=margin,
    )
    # The decision tree's first choice without a cost leaves the question open.
    favourite = preference[0] if preference else top
    if favourite not in values and favourite != top:
        confidence = "provisional" if confidence == "firm" else confidence
        measured = favourite in ctx.benches and not ctx.benches[favourite].mismatches
        reasons.append(
            f"the decision tree points to {ctx.name(favourite)}, which "
            + (
                "was benchmarked but has no cost at the SLO on this traffic"
                if measured
                else "has no benchmark on this traffic"
            )
            + f": benchmark {ctx.name(favourite)} on your traffic before committing"
        )
        flips[favourite] = _favourite_flip(ctx, favourite, top)
        runner = favourite if runner is None or runner not in preference[:2] else runner
    top, runner = _payback(ctx, top, runner, values, basis, reasons, flips)
    if runner is not None and runner in values and runner not in flips:
        flips[runner] = _flip(ctx, top, runner, values, basis)
    return Outcome(top, runner, confidence, reasons, basis, values, flips)


def _favourite_flip(ctx: RuleContext, favourite: str, top: str) -> Flip:
    """The cost per 1M output tokens at which the unbenchmarked favourite would win by the
    margin. Both sides per token (its fleet cannot be sized without its capacity): cost per 1M
    plus model-change cost spread over the monthly volume, when both are known."""
    keep = 1 - ctx.requirements.cost_margin
    top_cost = ctx.benches[top].cost_per_1m_output_usd
    volume = ctx.workload.output_tokens_per_month
    change, top_change = _monthly_change_cost(ctx, favourite), _monthly_change_cost(ctx, top)
    metric = f"bench.cost_per_1m_output_usd[{favourite}]"
    if top_cost is None:
        return Flip(
            f"{ctx.name(favourite)} wins if its measured cost at the SLO is more than "
            f"{1 - keep:.0%} below {ctx.name(top)}'s",
            metric,
            "<",
            None,
        )
    if volume and change is not None and top_change is not None and change != top_change:
        # c_f + change_f/V ≤ keep × (c_t + change_t/V), per 1M output tokens.
        threshold = keep * top_cost + (keep * top_change - change) * 1e6 / volume
        if threshold <= 0:
            return Flip(
                f"{ctx.name(favourite)} cannot win while its model changes cost "
                f"{money(change)} a month against {ctx.name(top)}'s {money(top_change)}",
                "requirements.model_changes_per_quarter",
                "<",
                ctx.requirements.model_changes_per_quarter,
            )
        return Flip(
            f"{ctx.name(favourite)} wins if its measured cost per 1M output tokens at the SLO is "
            f"below {usd(threshold)} (more than {1 - keep:.0%} below {ctx.name(top)}'s "
            f"{usd(top_cost)}, its model changes, {money(change)} a month against "
            f"{money(top_change)}, counted per token)",
            metric,
            "<",
            threshold,
        )
    below = top_cost * keep
    return Flip(
        f"{ctx.name(favourite)} wins if its measured cost per 1M output tokens at the SLO is "
        f"more than {1 - keep:.0%} below {ctx.name(top)}'s {usd(top_cost)} (below {usd(below)})",
        metric,
        "<",
        below,
    )


BASIS_METRICS = {
    "monthly_total_usd": "decision.monthly_total_usd",
    "monthly_gpu_usd": "bench.monthly_gpu_usd",
    "cost_per_1m_output_usd": "bench.cost_per_1m_output_usd",
}
BASIS_WORDS = {
    "monthly_total_usd": "monthly total cost (GPU fleet at the peak rate plus model changes)",
    "monthly_gpu_usd": "monthly GPU cost (fleet at the peak rate)",
    "cost_per_1m_output_usd": "cost per 1M output tokens at the SLO",
}


def _fmt_basis(basis: str, value: float) -> str:
    return (
        usd(value) + " per 1M output tokens"
        if basis == "cost_per_1m_output_usd"
        else money(value) + " a month"
    )


def _flip(ctx: RuleContext, top: str, runner: str, values: dict[str, float], basis: str) -> Flip:
    """The condition under which the runner-up would win by more than the margin, computed
    from the numbers: fewer model changes when it loses only on change cost, else a lower
    measured cost."""
    keep = 1 - ctx.requirements.cost_margin
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
            return Flip(
                f"{ctx.name(runner)} wins when model changes fall to ≤ {n:g} per quarter (today "
                f"{per_quarter:g}){_volume_flip(ctx, top_price, run_price, keep)}",
                "requirements.model_changes_per_quarter",
                "<=",
                n,
            )
    threshold = values[top] * keep
    return Flip(
        f"{ctx.name(runner)} wins if its {BASIS_WORDS[basis]} falls below "
        f"{_fmt_basis(basis, threshold)} (more than {1 - keep:.0%} below {ctx.name(top)}'s "
        f"{_fmt_basis(basis, values[top])}; today {_fmt_basis(basis, values[runner])})",
        f"{BASIS_METRICS[basis]}[{runner}]",
        "<",
        threshold,
    )


def _volume_flip(ctx: RuleContext, top: Priced, runner: Priced, keep: float) -> str:
    """ ", or when monthly volume exceeds V output tokens": the volume at which a cheaper
    per-token runner-up's GPU saving outweighs its higher change cost (fleet granularity aside)."""
    volume = ctx.workload.output_tokens_per_month
    if None in (
        volume,
        top.cost_per_1m,
        runner.cost_per_1m,
        top.monthly_change,
        runner.monthly_change,
    ):
        return ""
    assert top.cost_per_1m is not None and runner.cost_per_1m is not None
    assert top.monthly_change is not None and runner.monthly_change is not None
    per_token_gain = (keep * top.cost_per_1m - runner.cost_per_1m) / 1e6
    extra = runner.monthly_change - keep * top.monthly_change
    if per_token_gain <= 0 or extra <= 0:
        return ""
    return f", or when monthly volume exceeds {extra / per_token_gain:,.0f} output tokens (today {volume:,.0f})"


def _payback(
    ctx: RuleContext,
    top: str,
    runner: str | None,
    values: dict[str, float],
    basis: str,
    reasons: list[str],
    flips: dict[str, Flip],
) -> tuple[str, str | None]:
    current = current_engine(ctx)
    title = "Payback of switching from the engine running today"
    source = "DOMAIN.md: keeping the choice reversible; migration cost"
    if current is None:
        ctx.rule(
            "payback",
            title,
            source,
            None,
            "no engine runs today (requirements.current_engine): nothing to switch from",
        )
        return top, runner
    if current == top:
        ctx.rule(
            "payback", title, source, False, f"{ctx.name(current)} runs today and stays: no switch"
        )
        return top, runner
    if ctx.states[current].excluded:
        switch = switch_cost(ctx, top)
        ctx.rule(
            "payback",
            title,
            source,
            False,
            f"{ctx.name(current)} cannot stay ({'; '.join(ctx.states[current].excluded)}): migrate "
            f"to {ctx.name(top)} ({money(switch)} of migration work) and keep "
            f"{ctx.name(current)} running until then",
            switch_cost_usd=switch,
        )
        return top, runner
    switch = switch_cost(ctx, top)
    top_month = _monthly(price_of(ctx, top))
    current_month = _monthly(price_of(ctx, current))
    if switch is None or top_month is None or current_month is None:
        missing = (
            "requirements.engineer_week_usd"
            if switch is None
            else f"a benchmark of {ctx.name(current)} with a monthly cost"
        )
        reasons.append(
            f"{ctx.name(current)} runs today and stays: whether switching to {ctx.name(top)} pays "
            f"back is unknown (supply {missing})"
        )
        ctx.rule(
            "payback",
            title,
            source,
            None,
            f"unknown: supply {missing}; {ctx.name(current)} stays until a switch is shown to pay back",
            switch_cost_usd=switch,
        )
        flips[top] = Flip(
            f"{ctx.name(top)} wins once switching is shown to pay back within "
            f"{ctx.settings.payback_max_months:g} months (supply {missing})",
            f"decision.payback_months[{top}]",
            "<=",
            ctx.settings.payback_max_months,
        )
        return current, top
    saving = current_month - top_month
    months = switch / saving if saving > 0 else math.inf
    limit = ctx.settings.payback_max_months
    evidence = {
        "switch_cost_usd": switch,
        "monthly_saving_usd": saving,
        "payback_months": months,
        "limit_months": limit,
    }
    if months > limit:
        ctx.rule(
            "payback",
            title,
            source,
            True,
            f"switching to {ctx.name(top)} saves {money(saving)} a month and costs {money(switch)}: "
            f"pays back in {months_text(months)} (> {limit:g}): keep {ctx.name(current)}",
            **evidence,
        )
        reasons.append(
            f"{ctx.name(top)} is cheaper to run but its migration pays back in {months_text(months)} "
            f"(> {limit:g}): {ctx.name(current)} stays"
        )
        needed = switch / limit
        flips[top] = Flip(
            f"{ctx.name(top)} wins when switching saves at least {money(needed)} a month "
            f"(payback within {limit:g} months; today it saves {money(saving)})",
            f"decision.payback_months[{top}]",
            "<=",
            limit,
        )
        return current, top
    ctx.rule(
        "payback",
        title,
        source,
        False,
        f"switching to {ctx.name(top)} saves {money(saving)} a month for {money(switch)}: pays back "
        f"in {months_text(months)} (≤ {limit:g})",
        **evidence,
    )
    return top, runner


def months_text(months: float) -> str:
    return "never" if math.isinf(months) else f"{months:.1f} months"
