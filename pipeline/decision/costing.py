"""Cost at the SLO, the tie band, and the payback of switching: which benchmarked engine is
cheapest in total (GPU fleet at the peak rate plus the recurring cost of model changes), when
a gap is a tie, and when a switch does not pay back.

- **What is compared.** The GPU fleet the peak needs *before* rounding up to whole replicas
  (peak rate ÷ capacity per replica at the SLO, with the headroom and any N+1 spare), priced,
  plus model changes: for one traffic that is each engine's cost per 1M output tokens at the
  SLO times one volume, so the ranking keeps the real gap. Whole replicas would turn it into
  0 % when both engines need one replica and into 100 % at one replica against two. The bill
  (``monthly_cost_usd``, the payback) stays whole replicas: that is what is paid.
- **The tie band** is the larger of ``requirements.cost_margin`` and the repeat-run noise of
  the two benchmarks (the relative range of their cost over repeated runs): a gap a re-run
  could erase decides nothing. Two engines whose compared costs' bands overlap (the capacity
  band carried through the same formula) are a tie as well: the capacity cannot tell them
  apart.
- **Payback** of a switch = (the migration's engineer time + the new fleet's bill while both
  engines run through the migration and ``decision.revalidation_weeks``) ÷ the monthly saving
  on the bills; of a choice (a new deployment, the top two) = the extra adoption work ÷ the
  monthly saving. Worked whenever both engines have a monthly cost, the workload's own or the
  benchmark's; ``never`` when it saves nothing a month, ``unknown`` (with the missing input and
  why) when a cost is missing — never confused. With a capacity band on either bill, the
  payback band: soonest and latest, either end ``never``.

The ranking works in codes and numbers (:class:`Finding`); :mod:`pipeline.decision.present`
phrases them, so the wording can change without touching a comparison."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pipeline.costing import (
    HOURS_PER_WEEK,
    MONTHS_PER_QUARTER,
    Band,
    known_sum,
    parallel_run_usd,
    payback_band,
    payback_months,
    saving_band,
)
from pipeline.decision.context import Finding, RuleContext, current_engine
from pipeline.decision.measures import MODEL_CHANGES_PER_QUARTER, PAYBACK_MONTHS
from pipeline.decision.present import basis_note, finding_text, noise_note
from pipeline.decision.result import Payback, Ranking
from pipeline.decision.triggers import NEVER


def _migration_weeks(ctx: RuleContext, engine: str) -> float:
    override = {
        ctx.catalog.require_engine(k, f"requirements.migration_engineer_weeks.{k}"): v
        for k, v in ctx.requirements.migration_engineer_weeks.items()
    }
    if engine in override:
        return override[engine]
    return ctx.catalog.engines[engine].migration_weeks()


def switch_cost(ctx: RuleContext, engine: str) -> float | None:
    if engine == current_engine(ctx):
        return 0.0
    week = ctx.requirements.engineer_week_usd
    return None if week is None else _migration_weeks(ctx, engine) * week


def _change_cost_per_change(ctx: RuleContext, engine: str) -> float | None:
    """People's time plus GPU build time for one model or configuration change; None when
    a price it needs is not known."""
    week = ctx.requirements.engineer_week_usd
    change = ctx.catalog.engines[engine].change_cost()
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
    return per_quarter / MONTHS_PER_QUARTER * per_change


@dataclass(frozen=True)
class Priced:
    engine: str
    cost_per_1m: float | None
    monthly_gpu: float | None  # the bill: whole replicas at the peak rate
    monthly_change: float | None
    fleet_fraction_gpu: float | None = None  # the fleet before rounding: what is compared
    # The same figures at the capacity band's ends (None: no band, the benchmark's figures).
    cost_per_1m_band: Band | None = None
    monthly_gpu_band: Band | None = None
    fleet_fraction_gpu_band: Band | None = None

    def value(self, basis: str) -> float | None:
        return {
            "fleet_fraction_total_usd": known_sum(self.fleet_fraction_gpu, self.monthly_change),
            "fleet_fraction_gpu_usd": self.fleet_fraction_gpu,
            "cost_per_1m_output_usd": self.cost_per_1m,
        }[basis]

    def value_band(self, basis: str) -> Band | None:
        """The compared figure at the capacity band's ends (None: no band)."""
        if basis == "cost_per_1m_output_usd":
            return self.cost_per_1m_band
        band = self.fleet_fraction_gpu_band
        if basis == "fleet_fraction_gpu_usd" or band is None:
            return band
        return _plus(band, self.monthly_change)

    @property
    def monthly_total(self) -> float | None:
        return known_sum(self.monthly_gpu, self.monthly_change)

    def bill_band(self, basis: str) -> Band | None:
        """The bill a payback compares (``basis``: ``total`` or ``gpu``) at the band's ends,
        the bill itself at both where there is no band; None: no bill."""
        bill = self.monthly_total if basis == "total" else self.monthly_gpu
        if bill is None:
            return None
        if self.monthly_gpu_band is None:
            return bill, bill
        return _plus(self.monthly_gpu_band, self.monthly_change if basis == "total" else 0.0)


def _plus(band: Band, amount: float | None) -> Band | None:
    """``band`` moved by ``amount`` (None: unknown)."""
    return None if amount is None else (band[0] + amount, band[1] + amount)


def price_of(ctx: RuleContext, engine: str) -> Priced:
    bench = ctx.benches.get(engine)
    return Priced(
        engine,
        bench.cost_per_1m_output_usd if bench else None,
        bench.monthly_gpu_usd if bench else None,
        _monthly_change_cost(ctx, engine),
        bench.fractional_monthly_gpu_usd if bench else None,
        bench.cost_per_1m_output_band_usd if bench else None,
        bench.monthly_gpu_band_usd if bench else None,
        bench.fractional_monthly_gpu_band_usd if bench else None,
    )


def payback(ctx: RuleContext, engine: str, against: str | None = None) -> Payback | None:
    """Whether choosing ``engine`` pays for itself, and when (module docstring): against the
    engine running today (a switch), else against ``against`` (a new deployment choosing
    between two engines: ``engine``'s extra adoption work against its monthly saving). None
    when there is nothing to compare (this engine runs today, or nothing runs and no rival is
    given)."""
    current = current_engine(ctx)
    baseline = current if current is not None else against
    if baseline is None or baseline == engine:
        return None
    here, there = price_of(ctx, baseline), price_of(ctx, engine)
    if current is not None:
        switch = switch_cost(ctx, engine)
        both_run = _migration_weeks(ctx, engine) + ctx.settings.revalidation_weeks
        weeks: float | None = both_run
        parallel = (
            parallel_run_usd(there.monthly_gpu, both_run) if there.monthly_gpu is not None else None
        )
    else:
        switch, weeks, parallel = _extra_adoption(ctx, engine, baseline), None, 0.0
        if switch == 0 and _payback_missing(ctx, switch, here, there) is not None:
            return None  # nothing extra to adopt, and nothing known to compare
    kind: Literal["switch", "choice"] = "switch" if current is not None else "choice"
    known: dict[str, Any] = {
        "switch_cost_usd": switch,
        "parallel_run_usd": parallel,
        "parallel_weeks": weeks,
    }

    def found(status: str, code: str, finding: Finding, **more: Any) -> Payback:
        return Payback.model_validate(
            {
                "status": status,
                "kind": kind,
                "against": baseline,
                "reason": finding_text(replace(finding, code=f"{code}_{kind}"), ctx.name),
                **known,
                **more,
            }
        )

    missing = _payback_missing(ctx, switch, here, there)
    if missing is not None:
        return found("unknown", "payback_missing", Finding("", (baseline, engine), details=missing))
    assert switch is not None and parallel is not None  # _payback_missing said so
    bills = _bills(here, there)
    assert bills is not None  # _payback_missing said so
    here_bill, there_bill, basis = bills
    saving = here_bill - there_bill
    known |= _payback_bands(here, there, basis, switch, weeks)
    figures = {
        "switch_cost_usd": switch,
        "parallel_run_usd": parallel,
        "parallel_weeks": weeks or 0.0,
        "saving": saving,
        "here": here_bill,
        "there": there_bill,
    }
    months = payback_months(switch + parallel, saving)
    if months is None:
        never = Finding("", (engine, baseline), figures, (basis,))
        return found("never", "payback_never", never, monthly_saving_usd=saving)
    worked = Finding("", (engine, baseline), {**figures, "months": months}, (basis,))
    return found("months", "payback_worked", worked, months=months, monthly_saving_usd=saving)


def _payback_bands(
    here: Priced, there: Priced, basis: str, one_off: float, weeks: float | None
) -> dict[str, Any]:
    """The monthly saving and the payback at the bills' band ends (nothing when neither bill
    has a band): soonest with the new bill low and the current one high, latest the other
    way; the new fleet's run beside the old one is priced at that end's bill."""
    here_band, there_band = here.bill_band(basis), there.bill_band(basis)
    there_gpu = there.bill_band("gpu")  # what running the new fleet beside the old one costs
    if here.monthly_gpu_band is None and there.monthly_gpu_band is None:
        return {}
    assert here_band and there_band and there_gpu  # both bills are known
    saving = saving_band(here_band, there_band)

    def parallel(bill: float) -> float:
        return parallel_run_usd(bill, weeks) if weeks is not None else 0.0

    one_off_band = (one_off + parallel(there_gpu[0]), one_off + parallel(there_gpu[1]))
    return {
        "monthly_saving_band_usd": saving,
        "months_band": payback_band(one_off_band, saving),
    }


def _extra_adoption(ctx: RuleContext, engine: str, rival: str) -> float | None:
    """What adopting ``engine`` costs in engineer time beyond adopting ``rival`` (never below
    0); None when it depends on the price of an engineer-week nobody gave."""
    extra_weeks = max(_migration_weeks(ctx, engine) - _migration_weeks(ctx, rival), 0.0)
    week = ctx.requirements.engineer_week_usd
    if extra_weeks == 0:
        return 0.0
    return None if week is None else extra_weeks * week


def _bills(here: Priced, there: Priced) -> tuple[float, float, str] | None:
    """The two monthly bills a payback compares, alike: GPUs and model changes when both
    have both, else GPUs alone (``basis`` says which); None when either GPU bill is missing."""
    if here.monthly_gpu is None or there.monthly_gpu is None:
        return None
    if here.monthly_total is not None and there.monthly_total is not None:
        return here.monthly_total, there.monthly_total, "total"
    return here.monthly_gpu, there.monthly_gpu, "gpu"


def _payback_missing(
    ctx: RuleContext, switch: float | None, here: Priced, there: Priced
) -> tuple[str, ...] | None:
    """What a payback needs and lacks, and why: the price of an engineer-week, or a monthly
    cost of the engine it is compared with (``current_monthly_cost``) or of the one chosen
    (``new_monthly_cost``)."""
    if switch is None:
        return ("engineer_week_usd",)
    if here.monthly_gpu is None:
        return ("current_monthly_cost", _no_monthly_cost(ctx, here.engine))
    if there.monthly_gpu is None:
        return ("new_monthly_cost", _no_monthly_cost(ctx, there.engine))
    return None


def _no_monthly_cost(ctx: RuleContext, engine: str) -> str:
    """Why ``engine`` has no monthly cost at the workload's peak."""
    bench = ctx.benches.get(engine)
    if bench is None:
        return f"{ctx.name(engine)} has no benchmark on this traffic"
    if bench.mismatches:
        return f"its benchmark is not about your deployment: {'; '.join(bench.mismatches)}"
    return bench.cost_note or "its benchmark gives no fleet at the workload's peak rate"


def payback_measure(found: Payback | None) -> float | str | None:
    """The payback as the record measures it: months, ``never``, or None (unknown, no switch)."""
    if found is None or found.status == "unknown":
        return None
    return NEVER if found.status == "never" else found.months


# What the ranking compares, first that every priced engine has (module docstring).
BASES = ("fleet_fraction_total_usd", "fleet_fraction_gpu_usd")


def _basis(priced: list[Priced]) -> tuple[str, dict[str, float]]:
    """Monthly totals on the fleet before rounding when every priced engine has one, else
    its GPU cost alone, else cost per 1M output tokens."""
    for basis in BASES:
        values = {p.engine: p.value(basis) for p in priced}
        known = {e: v for e, v in values.items() if v is not None}
        if known and len(known) == len(values):
            return basis, known
    return "cost_per_1m_output_usd", {
        p.engine: p.cost_per_1m for p in priced if p.cost_per_1m is not None
    }


@dataclass(frozen=True)
class TieBand:
    """When a gap is a tie: the larger of the configured margin and the benchmarks' noise."""

    band: float
    set_by: str  # "margin" or "noise"
    margin: float
    noise: float | None  # the larger repeat-run noise of the engines compared (None: unknown)
    noise_by_engine: dict[str, float | None] = field(default_factory=dict)
    repeats: dict[str, int | None] = field(default_factory=dict)


def tie_band(ctx: RuleContext, engines: list[str]) -> TieBand:
    margin = ctx.requirements.cost_margin
    benches = {e: ctx.benches[e] for e in engines if e in ctx.benches}
    spreads = {e: b.noise_share for e, b in benches.items()}
    known = [v for v in spreads.values() if v is not None]
    noise = max(known) if known else None
    set_by = "noise" if noise is not None and noise > margin else "margin"
    return TieBand(
        noise if set_by == "noise" and noise is not None else margin,
        set_by,
        margin,
        noise,
        spreads,
        {e: b.repeats for e, b in benches.items()},
    )


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
    ranking: Ranking | None = None


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
    outcome, reasons = rank(ctx)
    outcome.reasons = [finding_text(r, ctx.name) for r in reasons]
    return outcome


def rank(ctx: RuleContext) -> tuple[Outcome, list[Finding]]:
    """The ranking after the rules ran on ``ctx``: the engine, its runner-up, why (as
    findings) and what would flip it (a what-if re-runs this on moved inputs)."""
    preference = _preference(ctx)
    reasons: list[Finding] = []
    flips: dict[str, Flip] = {}
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
        band = tie_band(ctx, list(engines))
        if runner:
            flips[runner] = Flip(
                Finding("measured_cheaper", (runner, top), {"band": band.band}),
                f"decision.cost_per_1m_output_usd[{runner}]",
                "<",
                None,
            )
        top, runner = _payback(ctx, top, runner, reasons, flips)
        ranking = _ranking(ctx, None, {}, None, band)
        return Outcome(top, runner, "provisional", [], None, {}, flips, ranking), reasons

    basis, values = _basis(priced)
    ranked = sorted(values, key=lambda e: (values[e], _tie_key(ctx, e)))
    top = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    confidence = "firm"
    tie: Finding | None = None
    band = tie_band(ctx, [e for e in (top, runner) if e])
    gap: float | None = None
    bands = {p.engine: b for p in priced if (b := p.value_band(basis)) is not None}
    overlap: bool | None = None
    if runner is not None:
        gap = (values[runner] - values[top]) / values[top] if values[top] else None
        if top in bands and runner in bands:
            overlap = bands[top][1] >= bands[runner][0] and bands[runner][1] >= bands[top][0]
        within = gap is not None and gap < band.band
        if within or overlap:
            confidence = "tie"
            first, second = sorted((top, runner), key=lambda e: _tie_key(ctx, e))
            # The margin (or noise) sets the tie when the gap is inside it; else the bands.
            set_by = band.set_by if within else "bands"
            figures = {"gap": gap or 0.0, "band": band.band, **_tie_figures(ctx, first, second)}
            if overlap:
                figures |= _band_figures(bands, first, second)
            tie = Finding(
                "tie",
                (top, runner, first, second),
                figures,
                (basis, set_by, *_tie_break(ctx, first, second)),
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
        fleet_fraction_gpu_usd={p.engine: p.fleet_fraction_gpu for p in priced},
        monthly_change_usd={p.engine: p.monthly_change for p in priced},
    )
    ranking = _ranking(ctx, basis, values, gap, band, bands, overlap)
    exceeded = {"gap": gap or 0.0, "band": band.band}
    if runner is not None and overlap is False:
        exceeded |= _band_figures(bands, top, runner)
    ctx.rule(
        "margin",
        "A difference larger than the tie band, cost bands apart",
        "docs/decision-rules.md#tie",
        tie is not None if runner else None,
        finding_text(
            Finding("margin_tie", tie.engines, tie.figures, tie.details)
            if tie
            else Finding("no_runner_up")
            if runner is None
            else Finding("margin_exceeded", (top, runner), exceeded, (basis,)),
            ctx.name,
        )
        + f" (tie band {band.band:.1%}, set by the {band.set_by}: {ranking.noise_note})",
        margin=band.margin,
        noise=band.noise,
        tie_band=band.band,
        tie_band_set_by=band.set_by,
        bands={e: list(b) for e, b in bands.items()},
        bands_overlap=overlap,
    )
    # The decision tree's first choice without a cost leaves the question open.
    favourite = preference[0] if preference else top
    if favourite not in values and favourite != top:
        confidence = "provisional" if confidence == "firm" else confidence
        measured = favourite in ctx.benches and not ctx.benches[favourite].mismatches
        reasons.append(
            Finding(
                "favourite_unpriced" if measured else "favourite_unbenchmarked", (favourite, top)
            )
        )
        flips[favourite] = _favourite_flip(ctx, favourite, top, basis, band)
        runner = favourite if runner is None or runner not in preference[:2] else runner
    top, runner = _payback(ctx, top, runner, reasons, flips)
    return Outcome(top, runner, confidence, [], basis, values, flips, ranking), reasons


def _band_figures(bands: dict[str, Band], first: str, second: str) -> dict[str, float]:
    """Two engines' cost bands as a finding's figures."""
    return {
        "first_low": bands[first][0],
        "first_high": bands[first][1],
        "second_low": bands[second][0],
        "second_high": bands[second][1],
    }


def _ranking(
    ctx: RuleContext,
    basis: str | None,
    values: dict[str, float],
    gap: float | None,
    band: TieBand,
    bands: dict[str, Band] | None = None,
    overlap: bool | None = None,
) -> Ranking:
    return Ranking(
        basis=basis,
        basis_note=basis_note(basis),
        values=values,
        gap=gap,
        margin=band.margin,
        noise=band.noise,
        noise_note=noise_note(band.noise_by_engine, band.repeats, ctx.name),
        tie_band=band.band,
        tie_band_set_by=band.set_by,  # type: ignore[arg-type]
        value_bands=dict(bands or {}),
        bands_overlap=overlap,
    )


def _favourite_flip(ctx: RuleContext, favourite: str, top: str, basis: str, band: TieBand) -> Flip:
    """The cost per 1M output tokens at which the unbenchmarked favourite would win past the
    tie band. Its fleet cannot be sized without its capacity, so it is taken to serve the
    same output as the top engine's fleet: cost per 1M × that volume, plus model changes,
    against the top engine's compared figure."""
    keep = 1 / (1 + band.band)
    top_bench = ctx.benches[top]
    top_cost = top_bench.cost_per_1m_output_usd
    metric = f"decision.cost_per_1m_output_usd[{favourite}]"
    engines = (favourite, top)
    whose = (top_bench.cost_basis,)
    if top_cost is None:
        return Flip(
            Finding("cost_below_rival", engines, {"band": band.band}, whose), metric, "<", None
        )
    top_price = price_of(ctx, top)
    fleet = top_price.fleet_fraction_gpu
    # Output tokens (millions) a month the compared figure prices: the fleet's, else the mean rate's.
    volume = (
        fleet / top_cost
        if basis != "cost_per_1m_output_usd" and fleet
        else (ctx.workload.output_tokens_per_month or 0) / 1e6
    )
    change, top_change = _monthly_change_cost(ctx, favourite), _monthly_change_cost(ctx, top)
    if volume and change is not None and top_change is not None and change != top_change:
        # c_f × volume + change_f ≤ keep × (c_t × volume + change_t), solved for c_f.
        threshold = keep * top_cost + (keep * top_change - change) / volume
        changes = {"change": change, "rival_change": top_change}
        if threshold <= 0:
            return Flip(
                Finding("changes_too_dear", engines, changes),
                MODEL_CHANGES_PER_QUARTER.name,
                "<",
                ctx.requirements.model_changes_per_quarter,
            )
        figures = {"threshold": threshold, "band": band.band, "rival_cost": top_cost, **changes}
        return Flip(
            Finding("cost_below_per_token", engines, figures, whose), metric, "<", threshold
        )
    below = top_cost * keep
    figures = {"band": band.band, "rival_cost": top_cost, "threshold": below}
    return Flip(Finding("cost_below_margin", engines, figures, whose), metric, "<", below)


def _payback(
    ctx: RuleContext,
    top: str,
    runner: str | None,
    reasons: list[Finding],
    flips: dict[str, Flip],
) -> tuple[str, str | None]:
    """Whether choosing ``top`` pays back: switching from the engine running today, else (a
    new deployment) its extra adoption work against the runner-up's; the engine that stays
    (and the runner-up) when it does not."""
    current = current_engine(ctx)
    limit = ctx.settings.payback_max_months

    def rule(fired: bool | None, effect: Finding, **evidence: Any) -> None:
        ctx.rule(
            "payback",
            "Payback of the engine chosen",
            "docs/decision-rules.md#payback",
            fired,
            finding_text(effect, ctx.name),
            **evidence,
        )

    if current is None:
        return _choice_payback(ctx, top, runner, reasons, flips, rule)
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
    found = payback(ctx, top)
    assert found is not None  # a switch from ``current`` to ``top``
    if found.status == "unknown":
        missing = _payback_missing(ctx, switch, price_of(ctx, current), price_of(ctx, top))
        assert missing is not None  # why the payback is unknown
        reasons.append(Finding("payback_unknown", (current, top), details=missing))
        rule(
            None,
            Finding("payback_unknown_rule", (current, top), details=missing),
            switch_cost_usd=switch,
            payback=found.reason,
        )
        flips[top] = Flip(
            Finding("payback_shown", (top, current), {"limit": limit}, missing),
            PAYBACK_MONTHS.key(top),
            "<=",
            limit,
        )
        return current, top
    figures, evidence = _payback_figures(found, limit)
    if found.status == "never" or (found.months is not None and found.months > limit):
        code = "never" if found.status == "never" else "too_long"
        rule(True, Finding(f"payback_{code}_rule", (top, current), figures), **evidence)
        reasons.append(Finding(f"payback_{code}_stays", (top, current), figures))
        flips[top] = _saving_needed(top, figures, limit)
        return current, top
    rule(False, Finding("pays_back", (top,), figures), **evidence)
    return top, runner


def _payback_figures(found: Payback, limit: float) -> tuple[dict[str, float], dict[str, Any]]:
    """A payback's figures for its wording, and the rule's evidence."""
    assert found.switch_cost_usd is not None and found.parallel_run_usd is not None
    assert found.monthly_saving_usd is not None
    figures = {
        "saving": found.monthly_saving_usd,
        "switch": found.switch_cost_usd,
        "parallel": found.parallel_run_usd,
        "weeks": found.parallel_weeks or 0.0,
        "limit": limit,
    }
    if found.months is not None:
        figures["months"] = found.months
    evidence = {
        "kind": found.kind,
        "against": found.against,
        "switch_cost_usd": found.switch_cost_usd,
        "parallel_run_usd": found.parallel_run_usd,
        "parallel_weeks": found.parallel_weeks,
        "monthly_saving_usd": found.monthly_saving_usd,
        "payback": found.months if found.status == "months" else "never",
        "limit_months": limit,
    }
    return figures, evidence


def _saving_needed(
    engine: str, figures: dict[str, float], limit: float, rival: str | None = None
) -> Flip:
    """What ``engine`` must save a month to pay back within ``limit``: a switch's migration
    and double running, or (``rival`` given: a new deployment) its extra adoption work."""
    cost = figures["switch"] + figures["parallel"]
    return Flip(
        Finding(
            "saving_needed" if rival is None else "choice_saving_needed",
            (engine,) if rival is None else (engine, rival),
            {"needed": cost / limit, **figures},
        ),
        PAYBACK_MONTHS.key(engine),
        "<=",
        limit,
    )


def _choice_payback(
    ctx: RuleContext,
    top: str,
    runner: str | None,
    reasons: list[Finding],
    flips: dict[str, Flip],
    rule: Any,
) -> tuple[str, str | None]:
    """A new deployment: whether ``top``'s extra adoption work over the runner-up's (engineer
    weeks) is paid back by its monthly saving within the limit; the runner-up is recommended
    when it is not. Nothing extra to adopt: nothing to pay back."""
    limit = ctx.settings.payback_max_months
    if runner is None:
        rule(None, Finding("nothing_runs"))
        return top, runner
    found = payback(ctx, top, runner)
    if found is None:
        rule(False, Finding("choice_no_extra", (top, runner)))
        return top, runner
    if found.status == "unknown":
        missing = _payback_missing(
            ctx, found.switch_cost_usd, price_of(ctx, runner), price_of(ctx, top)
        )
        assert missing is not None  # why the payback is unknown
        rule(None, Finding("choice_unknown", (top, runner), details=missing), payback=found.reason)
        return top, runner
    figures, evidence = _payback_figures(found, limit)
    if not figures["switch"]:
        rule(False, Finding("choice_no_extra", (top, runner), figures), **evidence)
        return top, runner
    if found.status == "never" or (found.months is not None and found.months > limit):
        code = "never" if found.status == "never" else "too_long"
        rule(True, Finding(f"choice_{code}", (top, runner), figures), **evidence)
        reasons.append(Finding(f"choice_{code}_stays", (top, runner), figures))
        flips[top] = _saving_needed(top, figures, limit, runner)
        return runner, top
    rule(False, Finding("choice_pays_back", (top, runner), figures), **evidence)
    return top, runner
