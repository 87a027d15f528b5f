"""The decision: a deterministic pure function from the stages' typed results, the engine
catalog and the team's requirements to a :class:`~pipeline.decision.result.DecisionRecord`.

The rules run in the order of docs/decision-rules.md and each leaves one rationale entry (fired, did
not fire, or unknown with what to supply):

1. ``hardware`` — an engine that runs on none of the team's hardware is excluded, and one that
   runs on only part of a mixed fleet unless ``requirements.one_engine_across_fleet`` is false;
   ``cuda`` — one whose current release needs a newer CUDA than the fleet runs is excluded.
2. ``local`` — laptop, CPU, Apple or edge: llama.cpp first.
3. ``maintenance`` — an engine in maintenance mode is excluded for a new deployment; one
   running today is kept running while a migration is planned.
4. ``features`` — a required feature (configured, or seen in the traffic) the engine lacks
   excludes it; a limited one is noted.
5. ``concurrency`` — peak ≤ ``CONCURRENCY_LOW_MAX`` on local hardware, or with weights that
   fit the GPUs only below ``DATACENTER_WEIGHT_BITS``: look hard at llama.cpp / Ollama;
   ≥ ``CONCURRENCY_HIGH_MIN``: vLLM or SGLang, Ollama is out.
6. ``slo`` — an engine whose benchmark never met the SLO is excluded.
7. ``model_churn`` — one or two stable models on one fixed NVIDIA SKU at huge volume:
   TensorRT-LLM first, weighed against its model-change cost.
8. ``prefix`` — shared-prefix ratio above ``PREFIX_HEAVY_SHARE``: SGLang or vLLM plus
   cache-aware routing, benchmark both; below ``PREFIX_LIGHT_SHARE``: published SGLang margins
   do not apply.
9. ``cost`` — among benchmarked viable engines, the lowest monthly total (the GPU fleet the
   peak needs before rounding to whole replicas, plus the recurring cost of model changes),
   else the lowest cost per 1M output tokens (:mod:`pipeline.decision.costing`).
10. ``margin`` — a gap inside the tie band (the larger of ``requirements.cost_margin`` and the
    benchmarks' repeat-run noise) is a tie, decided on maintenance trajectory and migration
    cost.
11. ``payback`` — a switch from the engine running today whose migration (work plus running
    both engines meanwhile) does not pay back within ``payback_max_months`` is not
    recommended; for a new deployment, neither is the first-ranked engine whose extra adoption
    work over the runner-up's does not.

Then every axis the decision rests on gets its flip value (:mod:`pipeline.decision.flips`)
and a revisit trigger; every requirement gets a trigger that fires when it changes.
12. ``transferability`` — benchmarks flagged as not transferable lower the confidence.
13. ``routing`` and 14. ``isolation`` — what prefix-aware routing saves at the fleet (a range
    over the simulated replica counts when the fleet size is unknown) and the layer that fits
    the team's platform, and whether tenants must be isolated (carried by the
    recommendation with its cost).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.capacity.present import capacity_words, prediction_sentence, transfer_sentence
from pipeline.capacity.result import PredictionCheck
from pipeline.decision import measures
from pipeline.decision.catalog import UNDATED, Fact, cuda_major, evidence_text, oldest_fact
from pipeline.decision.config import DecisionConfig, Requirements
from pipeline.decision.context import (
    DecisionInputs,
    EngineState,
    RuleContext,
    current_engine,
    known_plain,
    plain,
)
from pipeline.decision.costing import (
    Outcome,
    choose,
    payback,
    payback_measure,
    price_of,
    switch_cost,
)
from pipeline.decision.evidence import (
    EngineBench,
    engine_benches,
    missing_features,
    required_features,
    with_capacity,
    workload_from,
)
from pipeline.decision.flips import axis_flips
from pipeline.decision.measures import typed
from pipeline.decision.present import finding_text, flip_sentence
from pipeline.decision.result import (
    SCHEMA_VERSION,
    AxisFlip,
    Candidate,
    DecisionRecord,
    IsolationAdvice,
    Payback,
    Recommendation,
    Routing,
)
from pipeline.decision.routing import isolation_advice, routing_value
from pipeline.decision.rules import RULES, uncovered
from pipeline.decision.triggers import crossed, evaluate_previous, trigger
from pipeline.present.text import money, usd
from pipeline.thresholds import (
    CATALOG_MAX_AGE_DAYS,
    CONCURRENCY_HIGH_MIN,
    CONCURRENCY_LOW_MAX,
    PREFIX_HEAVY_SHARE,
    PREFIX_LIGHT_SHARE,
)
from pipeline.unknown import Unknown


def measurements(
    ctx: RuleContext, top: str | None, runner: str | None, outcome: Outcome
) -> dict[str, Any]:
    """The flat metrics triggers compare; keys name the stage output each comes from."""
    w = ctx.workload
    as_of = ctx.inputs.as_of
    m: dict[str, Any] = {
        measures.PEAK_CONCURRENCY.name: w.peak_concurrency,
        measures.CONCURRENCY_ESTIMATED.name: w.concurrency_estimated,
        measures.MEAN_RATE.name: w.mean_rate_rps,
        measures.PEAK_RATE.name: w.peak_rate_rps,
        measures.OUTPUT_TOKENS_MEAN.name: w.output_mean,
        measures.OUTPUT_TOKENS_PER_MONTH.name: w.output_tokens_per_month,
        measures.FEATURES_REQUIRED.name: list(ctx.required),
        measures.SHARED_PREFIX_RATIO.name: w.prefix_share,
        measures.CATALOG_AS_OF.name: ctx.catalog.as_of.isoformat(),
        measures.FIXED_SKU.name: ctx.requirements.fixed_sku,
        measures.MODEL_CHANGES_PER_QUARTER.name: ctx.requirements.model_changes_per_quarter,
    }
    for engine, spec in ctx.catalog.engines.items():
        m[measures.ENGINE_STATUS.key(engine)] = spec.status.state
        cuda = spec.current_cuda()
        m[measures.MIN_CUDA_MAJOR.key(engine)] = cuda_major(cuda.min_cuda) if cuda else None
        m[measures.MISSING_FEATURES.key(engine)] = len(
            missing_features(engine, ctx.catalog, ctx.required)
        )
    for engine in sorted(ctx.catalog.engines):
        # Every engine has its keys, unknown (None) until benchmarked, so a trigger watching a
        # runner-up that has no benchmark yet can be evaluated once it has one.
        # ``bench.*``: the benchmark's own figures; ``decision.*``: the ones the decision used
        # (the workload's own from the capacity stage, else the benchmark's: see
        # ``decision.cost_basis``).
        bench = ctx.benches.get(engine)
        m[f"bench.cost_per_1m_output_usd[{engine}]"] = (
            bench.benchmark_cost_per_1m_output_usd if bench else None
        )
        m[measures.BENCH_CAPACITY.key(engine)] = bench.benchmark_capacity_rps if bench else None
        m[measures.BENCH_AGE_DAYS.key(engine)] = bench.age_days(as_of) if bench else None
        m[measures.BENCH_MONTHLY_GPU.key(engine)] = (
            bench.benchmark_monthly_gpu_usd if bench else None
        )
        m[measures.BENCH_FLEET_CAPACITY.key(engine)] = (
            _product(bench.benchmark_capacity_rps, bench.benchmark_replicas_at_peak)
            if bench
            else None
        )
        m[measures.COST_BASIS.key(engine)] = bench.cost_basis if bench else None
        m[f"decision.cost_per_1m_output_usd[{engine}]"] = (
            bench.cost_per_1m_output_usd if bench else None
        )
        m[measures.CAPACITY.key(engine)] = bench.capacity_rps if bench else None
        m[measures.REPLICAS_AT_PEAK.key(engine)] = bench.replicas_at_peak if bench else None
        m[measures.MONTHLY_GPU.key(engine)] = bench.monthly_gpu_usd if bench else None
        m[measures.MONTHLY_TOTAL.key(engine)] = price_of(ctx, engine).monthly_total
        m[measures.PAYBACK_MONTHS.key(engine)] = payback_measure(
            payback(ctx, engine, _rival(engine, top, runner))
        )
        m[measures.GPU_HOUR_USD.key(engine)] = bench.gpu_hour_usd if bench else None
        m[measures.FLEET_FRACTION_GPU.key(engine)] = (
            bench.fractional_monthly_gpu_usd if bench else None
        )
        m[measures.FLEET_CAPACITY.key(engine)] = (
            _product(bench.capacity_rps, bench.replicas_at_peak) if bench else None
        )
    for engine, bench in sorted(ctx.benches.items()):
        check = bench.capacity.prediction_check if bench.capacity else None
        if check is not None:  # only where the workload's own traffic was load-tested
            m |= prediction_measurements(engine, check)
    # Each requirement as canonical JSON (unset: null), so next quarter's configuration is
    # compared with this one's key by key.
    for key, value in ctx.requirements.model_dump(mode="json").items():
        m[measures.SETTING.key(key)] = json.dumps(value, sort_keys=True)
    values = outcome.values
    if top is not None and runner is not None and top in values and runner in values:
        # The ranking's own basis, as a share of the cheaper one (order-free: a dearer
        # incumbent kept for its payback gives the same gap as a cheaper one).
        a, b = values[top], values[runner]
        m[measures.COST_GAP_TOP_TWO.name] = abs(b - a) / min(a, b) if min(a, b) > 0 else None
    flat: dict[str, Any] = plain(m)
    return flat


def prediction_measurements(engine: str, check: PredictionCheck | Unknown) -> dict[str, Any]:
    """An engine's capacity predicted against measured, as measurements: the figures, the
    signed error the ledger keeps quarter over quarter (None: unknown) and the sentence
    ``explain`` prints."""
    known = None if isinstance(check, Unknown) else check
    return {
        measures.PREDICTION_ERROR.key(engine): known.error if known else None,
        measures.PREDICTED_CAPACITY.key(engine): known.predicted_rps if known else None,
        measures.MEASURED_CAPACITY.key(engine): known.measured_rps if known else None,
        measures.PREDICTION_CHECK.key(engine): prediction_sentence(check),
    }


def _facts_used(ctx: RuleContext, routing: Routing) -> list[Fact]:
    """The catalog facts this decision read: every candidate's (its hardware and the notes on
    the team's, the CUDA release its latest version needs, the required features, the change
    cost) and the routing layer it recommends."""
    layers = (routing.layer,) if routing.recommended and routing.layer else ()
    return ctx.catalog.facts_used(list(ctx.states), ctx.required, ctx.requirements.hardware, layers)


def _catalog_age(ctx: RuleContext, facts: list[Fact], answer: tuple[str, ...]) -> dict[str, Any]:
    """The oldest fact used (its key, evidence date and age at the decision's date; an undated
    fact is the oldest there is, its age ``undated``, which compares as older than any limit)
    and how many facts used are undated (those of the ``answer``'s engines by name); a
    rationale entry that says so."""
    oldest = oldest_fact(facts)
    as_of = ctx.inputs.as_of
    undated = [f.key for f in facts if f.evidence_date is None]
    # Even the oldest fact used dated after the decision's date: evidence that date could not
    # have had, so its age is unknown (never 0, "fresh", and never negative).
    after = (
        oldest is not None
        and oldest.evidence_date is not None
        and as_of is not None
        and oldest.evidence_date > as_of
    )
    age: int | str | None = None
    if oldest is not None and oldest.evidence_date is None:
        age = UNDATED
    elif oldest is not None and as_of is not None and not after:
        age = oldest.age_days(as_of)
    stale = crossed(age, ">", CATALOG_MAX_AGE_DAYS)
    if oldest is None:
        effect = "no catalog fact was used: its age is unknown"
    elif oldest.evidence_date is None:
        effect = (
            f"{len(undated)} fact(s) used carry no evidence date, {oldest.key} first: an "
            "undated fact counts as the oldest evidence there is; re-verify them upstream and "
            "date them"
        )
    elif after:
        effect = (
            f"the oldest fact used is {oldest.key}, evidence of {oldest.evidence_date}, after the "
            f"decision's date {as_of}: its age at that date is unknown; give a report date on or "
            f"after {oldest.evidence_date} (--as-of or bench.as_of), or the catalog of that date "
            "(decision.catalog)"
        )
    else:
        effect = f"the oldest fact used is {oldest.key}, evidence of {oldest.evidence_date}"
        effect += f" ({age} days before {as_of.isoformat()})" if as_of is not None else ""
        effect += (
            f": older than {CATALOG_MAX_AGE_DAYS} days, re-verify it upstream"
            if stale
            else ""
            if stale is False
            else "; its age is unknown (no decision date: give --as-of)"
        )
    ctx.rule(
        "catalog_age",
        "Age of the catalog facts used",
        "docs/decision-rules.md#catalog-age",
        stale,
        effect,
        oldest_fact=oldest.key if oldest else None,
        oldest_fact_date=evidence_text(oldest.evidence_date) if oldest else None,
        oldest_fact_age_days=age,
        max_age_days=CATALOG_MAX_AGE_DAYS,
        facts_used=len(facts),
        undated_facts=len(undated),
        undated_facts_of_the_answer=[
            k for k in undated if any(k.startswith(f"engines.{e}.") for e in answer)
        ],
    )
    return {
        measures.OLDEST_FACT.name: oldest.key if oldest else None,
        measures.OLDEST_FACT_DATE.name: evidence_text(oldest.evidence_date) if oldest else None,
        measures.OLDEST_FACT_AGE_DAYS.name: age,
        measures.UNDATED_FACTS_USED.name: len(undated),
    }


def _product(a: float | None, b: int | None) -> float | None:
    return a * b if a is not None and b is not None else None


def _crossing(
    id: str,
    metric: str,
    value: float | None,
    threshold: float,
    m: dict[str, Any],
    why: str,
    *,
    at_or_below: bool = False,
    strict: bool = False,
    subject: str = "the workload",
) -> Any:
    """A trigger that fires when ``value`` moves to the other side of ``threshold`` from where
    it is today. The band's own side is ``≤ threshold`` when ``at_or_below`` (else ``≥``, or
    ``>`` / ``<`` with ``strict``); unknown today: armed toward the band. ``subject`` is what
    enters or leaves it."""
    inside_op = ("<" if strict else "<=") if at_or_below else (">" if strict else ">=")
    outside_op = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[inside_op]
    inside = crossed(value, inside_op, threshold)
    comparator = outside_op if inside else inside_op
    direction = "leaves" if inside else "enters"
    source, _, band = why.partition(": ")
    words = f"{source}: {subject} {direction} the band where {band}" if band else why
    return trigger(f"{id}.{direction}", metric, comparator, threshold, m, words)


def _triggers(
    ctx: RuleContext,
    m: dict[str, Any],
    top: str | None,
    outcome: Outcome,
    flips: list[AxisFlip],
) -> list[Any]:
    low = CONCURRENCY_LOW_MAX
    high = CONCURRENCY_HIGH_MIN
    w = ctx.workload
    out = [
        _crossing(
            "concurrency.low",
            measures.PEAK_CONCURRENCY.name,
            w.peak_concurrency,
            low,
            m,
            f"docs/decision-rules.md#concurrency: peak concurrency ≤ {low:g} leaves little to batch (llama.cpp / Ollama territory)",
            at_or_below=True,
        ),
        _crossing(
            "concurrency.high",
            measures.PEAK_CONCURRENCY.name,
            w.peak_concurrency,
            high,
            m,
            f"docs/decision-rules.md#concurrency: peak concurrency ≥ {high:g} needs vLLM or SGLang; Ollama is out",
        ),
        _crossing(
            "prefix.heavy",
            measures.SHARED_PREFIX_RATIO.name,
            w.prefix_share,
            PREFIX_HEAVY_SHARE,
            m,
            "docs/decision-rules.md#prefix-sharing: shared-prefix ratio above "
            f"~{PREFIX_HEAVY_SHARE:.0%}: benchmark SGLang against vLLM on your traffic",
            strict=True,
        ),
        _crossing(
            "prefix.light",
            measures.SHARED_PREFIX_RATIO.name,
            w.prefix_share,
            PREFIX_LIGHT_SHARE,
            m,
            f"docs/decision-rules.md#prefix-sharing: below ~{PREFIX_LIGHT_SHARE:.0%} the published "
            "SGLang-vs-vLLM margins do not apply",
            at_or_below=True,
            strict=True,
        ),
        # Stale today: armed for its re-verification (the rationale's catalog_age entry says to
        # re-verify it); fresh today: fires when it grows stale.
        _crossing(
            "catalog.stale",
            measures.OLDEST_FACT_AGE_DAYS.name,
            m.get(measures.OLDEST_FACT_AGE_DAYS.name),
            CATALOG_MAX_AGE_DAYS,
            m,
            "docs/decision-rules.md#catalog-age: the oldest catalog fact used ("
            f"{m.get(measures.OLDEST_FACT.name) or 'none dated'}, evidence of "
            f"{m.get('catalog.oldest_fact_date') or 'no date'}) is older than "
            f"{CATALOG_MAX_AGE_DAYS} days (engines release every few weeks)",
            strict=True,
            subject="the decision's catalog evidence",
        ),
    ]
    if ctx.requirements.fixed_sku is not True:
        out.append(
            trigger(
                "fleet.fixed_sku",
                measures.FIXED_SKU.name,
                "==",
                True,
                m,
                "docs/decision-rules.md#model-churn: the fleet becoming one fixed NVIDIA SKU favours TensorRT-LLM",
            )
        )
    if top is not None:
        out.append(
            trigger(
                f"engine.status[{top}]",
                measures.ENGINE_STATUS.key(top),
                "!=",
                "active",
                m,
                "docs/decision-rules.md#maintenance: the chosen engine's status changes (e.g. maintenance mode)",
            )
        )
        if ctx.requirements.cuda_version is not None:
            out.append(
                trigger(
                    f"engine.cuda[{top}]",
                    measures.MIN_CUDA_MAJOR.key(top),
                    ">",
                    cuda_major(ctx.requirements.cuda_version),
                    m,
                    "docs/decision-rules.md#cuda: the chosen engine's current release needs a "
                    "newer CUDA than your fleet runs",
                )
            )
        out.append(
            trigger(
                f"engine.missing_features[{top}]",
                measures.MISSING_FEATURES.key(top),
                ">",
                0,
                m,
                "docs/decision-rules.md#features: a model or feature you need is not supported by the chosen engine",
            )
        )
        if top in ctx.benches and ctx.inputs.bench is not None:
            max_age = ctx.inputs.max_age_days
            out.append(
                _crossing(
                    f"bench.stale[{top}]",
                    measures.BENCH_AGE_DAYS.key(top),
                    m.get(measures.BENCH_AGE_DAYS.key(top)),
                    max_age,
                    m,
                    f"docs/decision-rules.md#benchmark-age: the chosen engine's benchmark is older than {max_age} days "
                    "(about six months; engines release every few weeks)",
                    strict=True,
                )
            )
            if m.get(measures.FLEET_CAPACITY.key(top)) is not None:
                whose = (
                    "this workload's capacity per replica"
                    if ctx.benches[top].cost_basis == "workload"
                    else "the benchmarked capacity"
                )
                out.append(
                    trigger(
                        "traffic.beyond_fleet",
                        measures.PEAK_RATE.name,
                        ">",
                        m[measures.FLEET_CAPACITY.key(top)],
                        m,
                        f"docs/decision-rules.md#revisit-triggers: traffic grows beyond what {whose} and the fleet cover",
                    )
                )
    if measures.COST_GAP_TOP_TWO.name in m and outcome.ranking is not None:
        out.append(
            _crossing(
                "cost.margin_top_two",
                measures.COST_GAP_TOP_TWO.name,
                m[measures.COST_GAP_TOP_TWO.name],
                outcome.ranking.tie_band,
                m,
                "docs/decision-rules.md#tie: the top two are within the tie band (a tie, decided "
                "on other grounds)",
                at_or_below=True,
                strict=True,
            )
        )
    for engine, flip in sorted(outcome.flips.items()):
        if flip.threshold is not None:
            out.append(
                trigger(
                    f"flip[{engine}]",
                    flip.metric,
                    flip.comparator,
                    plain(flip.threshold),
                    m,
                    finding_text(flip.condition, ctx.name),
                )
            )
    return out + _flip_triggers(ctx, m, flips) + _requirement_triggers(m)


# The natural bounds of an axis: a trigger beyond them could never fire.
_AXIS_BOUNDS = {
    measures.SHARED_PREFIX_RATIO.name: (0.0, 1.0),
    measures.MODEL_CHANGES_PER_QUARTER.name: (0.0, None),
}


def _flip_triggers(ctx: RuleContext, m: dict[str, Any], flips: list[AxisFlip]) -> list[Any]:
    """A trigger per flip found (the input reaching its flip value), and where none was
    found, one at the edge of the range searched (beyond it, nothing was checked)."""
    out = []
    for flip in flips:
        if flip.direction == "change" or (flip.threshold is None and not flip.searched):
            continue  # hardware: the requirement's own trigger; unknown: nothing to watch
        up = flip.direction == "up"
        why = flip_sentence(flip, ctx.name)
        if flip.threshold is not None:
            threshold, comparator = flip.threshold, ">=" if up else "<="
            id: str = flip.direction
        else:
            threshold, comparator = (flip.searched[-1], ">") if up else (flip.searched[0], "<")
            id = f"{flip.direction}.beyond_search"
            if threshold in _AXIS_BOUNDS.get(flip.metric, ()):
                continue
        out.append(
            trigger(f"flip.{flip.axis}.{id}", flip.metric, comparator, plain(threshold), m, why)
        )
    return out


def _requirement_triggers(m: dict[str, Any]) -> list[Any]:
    """One trigger per requirement: it fires when next quarter's configuration differs."""
    prefix = measures.SETTING.name + "["
    return [
        trigger(
            measures.REQUIREMENT_CHANGED.key(key[len(prefix) : -1]),
            key,
            "!=",
            value,
            m,
            "a requirement the decision read has changed since (next quarter's configuration "
            "against this one's)",
        )
        for key, value in m.items()
        if key.startswith(prefix)
    ]


def context(
    inputs: DecisionInputs,
    requirements: Requirements,
    settings: DecisionConfig,
) -> RuleContext:
    """The rules' context before any rule ran: the workload, each engine's evidence."""
    workload = workload_from(
        inputs.shape, inputs.prefix, settings, inputs.peak_window, inputs.missing
    )
    models = tuple(sorted(set(requirements.models) | set(workload.models)))
    benches = with_capacity(
        engine_benches(
            inputs.bench,
            inputs.fits,
            inputs.catalog,
            requirements.hardware,
            models,
            as_of=inputs.as_of,
            max_age_days=inputs.max_age_days,
        )
        if inputs.bench
        else {},
        inputs.capacity,
        inputs.catalog,
        inputs.missing.get("capacity"),
        workload.mean_rate_rps,
    )
    return RuleContext(
        inputs=inputs,
        requirements=requirements,
        settings=settings,
        workload=workload,
        benches=benches,
        required=required_features(requirements, workload),
        states={engine: EngineState() for engine in inputs.catalog.engines},
    )


def decide(
    inputs: DecisionInputs,
    requirements: Requirements,
    settings: DecisionConfig,
) -> DecisionRecord:
    return decided(context(inputs, requirements, settings))


def decided(ctx: RuleContext) -> DecisionRecord:
    """The record of a fresh context: :func:`context`'s, or one a what-if moved
    (:mod:`pipeline.decision.flips`)."""
    inputs, requirements = ctx.inputs, ctx.requirements
    for rule in RULES:
        rule(ctx)
    outcome = choose(ctx)
    top, runner = outcome.engine, outcome.runner_up
    _transferability(ctx, top, runner, outcome)
    _removed_backends(ctx, top, runner, outcome)
    routing = routing_value(ctx, top, runner)
    isolation, advice = isolation_advice(ctx, top, routing)
    flips = axis_flips(ctx, top, runner)
    m = measurements(ctx, top, runner, outcome)
    answer = tuple(e for e in (top, runner) if e)
    m |= plain(_catalog_age(ctx, _facts_used(ctx, routing), answer))
    triggers = _triggers(ctx, m, top, outcome, flips)
    previous = evaluate_previous(inputs.previous, m) if inputs.previous else None
    state = "revisit" if previous and previous.fired else "decided"
    candidates = _candidates(ctx, top, runner, outcome, flips)
    recommendation = Recommendation(
        engine=top,
        engine_name=ctx.name(top) if top else None,
        routing_layer=routing.layer if routing.recommended else None,
        runner_up=runner,
        confidence=outcome.confidence,  # type: ignore[arg-type]
        confidence_reasons=outcome.reasons,
        state=state,  # type: ignore[arg-type]
        headline=_headline(ctx, top, runner, outcome, routing, advice, previous),
        isolation=advice,
    )
    return DecisionRecord(
        schema_version=SCHEMA_VERSION,
        workload=inputs.workload_name,
        as_of=inputs.as_of.isoformat() if inputs.as_of else None,
        recommendation=recommendation,
        candidates=candidates,
        rationale=ctx.rules,
        routing=routing,
        isolation=isolation,
        triggers=triggers,
        measurements=typed(m),
        previous=previous,
        requirements=requirements.model_dump(mode="json"),
        catalog={
            "source": inputs.catalog_source,
            "sha256": inputs.catalog.sha256,
            "as_of": inputs.catalog.as_of.isoformat(),
            "oldest_fact_used": m[measures.OLDEST_FACT.name],
            "oldest_fact_date": m[measures.OLDEST_FACT_DATE.name],
            "undated_facts_used": m[measures.UNDATED_FACTS_USED.name],
        },
        inputs=dict(sorted(inputs.digests.items())),
        ranking=outcome.ranking,
        flips=flips,
    )


def _transferability(
    ctx: RuleContext, top: str | None, runner: str | None, outcome: Outcome
) -> None:
    reasons = []
    if ctx.workload.concurrency_estimated:
        reasons.append(
            "peak concurrency is estimated from a latency model (the trace logs no durations)"
        )
    for engine in (top, runner):
        bench = ctx.benches.get(engine) if engine else None
        if bench and bench.flags:
            reasons.append(
                f"{ctx.name(bench.engine)}'s benchmark is flagged as not transferable: {', '.join(bench.flags)}"
            )
    for engine in dict.fromkeys(e for e in (top, runner) if e):
        bench = ctx.benches.get(engine)
        if bench is None or bench.cost_note is None:
            continue
        if any(bench.cost_note in said for said in outcome.reasons):
            continue  # the cost ranking already gave this note as its reason
        # A note without a workload cost says why there is none; with one, why it is provisional.
        if bench.cost_basis == "benchmark" or bench.cost_per_1m_output_usd is None:
            reasons.append(f"{ctx.name(engine)}: {bench.cost_note}")
        else:
            reasons.append(
                f"{ctx.name(engine)}'s capacity on this workload is provisional: {bench.cost_note}"
            )
    if ctx.inputs.bench is not None and not ctx.inputs.bench.comparable and len(ctx.benches) > 1:
        reasons.append(
            "the benchmarks are not like for like: " + "; ".join(ctx.inputs.bench.differences)
        )
    unbenchmarked = [
        ctx.name(e)
        for e in (top, runner)
        if e and e not in ctx.benches and not any(ctx.name(e) in r for r in outcome.reasons)
    ]
    if unbenchmarked and outcome.basis:
        reasons.append(f"no benchmark of {', '.join(unbenchmarked)} on this traffic")
    ctx.rule(
        "transferability",
        "Benchmarks that transfer to production",
        "docs/decision-rules.md#transferability",
        bool(reasons),
        "; ".join(reasons) if reasons else "the deciding benchmarks are transferable",
        flags={e: list(b.flags) for e, b in ctx.benches.items()},
        cost_basis={e: b.cost_basis for e, b in ctx.benches.items()},
    )
    if reasons and outcome.confidence == "firm":
        outcome.confidence = "provisional"
    outcome.reasons.extend(r for r in reasons if r not in outcome.reasons)


def _removed_backends(
    ctx: RuleContext, top: str | None, runner: str | None, outcome: Outcome
) -> None:
    """An answer resting on a benchmark of a serving backend its engine has removed: that
    deployment can no longer be built, so the answer is provisional until it is re-benchmarked
    on the backend that replaced it."""
    for engine in dict.fromkeys(e for e in (top, runner) if e):
        bench = ctx.benches.get(engine)
        spec = ctx.catalog.engines[engine]
        removed = spec.removed_backends.get(bench.backend or "") if bench else None
        if bench is None or removed is None:
            continue
        outcome.reasons.append(
            f"{ctx.name(engine)}'s benchmark ran on its {bench.backend} backend, removed "
            f"{removed.since.isoformat()}: re-benchmark on {removed.replaced_by}"
        )
        outcome.confidence = "provisional" if outcome.confidence == "firm" else outcome.confidence


def _candidates(
    ctx: RuleContext, top: str | None, runner: str | None, outcome: Outcome, flips: list[AxisFlip]
) -> list[Candidate]:
    out = []
    for engine, state in ctx.states.items():
        bench = ctx.benches.get(engine)
        price = price_of(ctx, engine)
        switch = switch_cost(ctx, engine)
        status = (
            "excluded"
            if state.excluded
            else "recommended"
            if engine == top
            else "runner-up"
            if engine == runner
            else "viable"
        )
        reasons = state.excluded + state.notes
        if not bench and not state.excluded:
            reasons.append("not benchmarked on this traffic")
        out.append(
            Candidate(
                engine=engine,
                name=ctx.name(engine),
                status=status,  # type: ignore[arg-type]
                reasons=reasons,
                benchmarked=bench is not None,
                benchmark=bench.candidate if bench else None,
                gpus_at_peak=(
                    bench.replicas_at_peak * bench.gpu_count
                    if bench and bench.replicas_at_peak is not None and bench.gpu_count
                    else None
                ),
                cost_per_1m_output_usd=plain(price.cost_per_1m),
                monthly_cost_usd=plain(price.monthly_gpu),
                monthly_cost_mean_rate_usd=plain(bench.monthly_gpu_usd_mean_rate)
                if bench
                else None,
                monthly_change_cost_usd=plain(price.monthly_change),
                monthly_total_usd=plain(price.monthly_total),
                switch_cost_usd=plain(switch),
                payback=_plain_payback(payback(ctx, engine, _rival(engine, top, runner))),
                flip_condition=_flip_condition(ctx, engine, outcome, flips),
                **_workload_figures(bench),
            )
        )
    order = {"recommended": 0, "runner-up": 1, "viable": 2, "excluded": 3}
    return sorted(out, key=lambda c: (order[c.status], c.engine))


def _flip_condition(
    ctx: RuleContext, engine: str, outcome: Outcome, flips: list[AxisFlip]
) -> str | None:
    """What would make ``engine`` the answer: the ranking's own condition (an unpriced
    favourite's cost to reach, a payback to show), then each axis's flip that leads to it."""
    sentences = (
        [finding_text(outcome.flips[engine].condition, ctx.name)] if engine in outcome.flips else []
    )
    sentences += [
        flip_sentence(f, ctx.name) for f in flips if f.engine == engine and f.threshold is not None
    ]
    return " ".join(s if s.endswith(".") else s + "." for s in sentences) or None


def _rival(engine: str, top: str | None, runner: str | None) -> str | None:
    """The engine a new deployment's payback of ``engine`` is weighed against: the other of
    the top two (None for any other engine)."""
    return runner if engine == top else top if engine == runner else None


def _plain_payback(found: Payback | None) -> Payback | None:
    """The payback with its figures rounded as the record's numbers are."""
    if found is None:
        return None
    # Validated again, so the rounded bands are tuples as a record read back has them.
    return Payback.model_validate(
        found.model_dump()
        | {
            key: plain(getattr(found, key))
            for key in (
                "months",
                "switch_cost_usd",
                "parallel_run_usd",
                "monthly_saving_usd",
                "monthly_saving_band_usd",
                "months_band",
            )
        }
    )


def _workload_figures(bench: EngineBench | None) -> dict[str, Any]:
    """The candidate's workload capacity and price sheet beside the benchmark's figure."""
    if bench is None:
        return {}
    out: dict[str, Any] = {
        "cost_basis": bench.cost_basis if bench.cost_per_1m_output_usd is not None else None,
        "cost_note": bench.cost_note,
        "capacity_rps": plain(bench.benchmark_capacity_rps),
        "replicas": bench.replicas_at_peak,
        "benchmark_cost_per_1m_output_usd": plain(bench.benchmark_cost_per_1m_output_usd),
        "benchmark_monthly_cost_usd": plain(bench.benchmark_monthly_gpu_usd),
        "replicas_band": bench.replicas_band_at_peak,
        "monthly_cost_band_usd": _band(bench.monthly_gpu_band_usd),
        "cost_per_1m_output_band_usd": _band(bench.cost_per_1m_output_band_usd),
    }
    found = bench.capacity
    if found is None:
        return out
    band = found.workload_capacity_band_rps
    out |= {
        "workload_capacity_rps": None
        if isinstance(found.workload_capacity_rps, Unknown)
        else plain(found.workload_capacity_rps),
        "workload_capacity_band_rps": None if isinstance(band, Unknown) else plain(list(band)),
        "capacity_band_basis": found.band_basis,
        "capacity_basis": found.capacity_basis,
        "transfer": transfer_sentence(found),
        "provisional_reason": found.provisional_reason,
        **plain(capacity_words(found)),
    }
    cost = bench.workload_cost
    if cost is not None:
        out |= {
            "cost_per_1m_output_decode_usd": plain(cost.cost_per_1m_output_usd),
            "cost_per_1m_input_usd": known_plain(cost.cost_per_1m_input_usd),
            "cost_per_1m_cached_input_usd": known_plain(cost.cost_per_1m_cached_input_usd),
            "fleet_cost_per_1m_output_usd": known_plain(cost.fleet_cost_per_1m_output_usd),
        }
    return out


def _band(band: tuple[float, float] | None) -> list[float] | None:
    return None if band is None else plain(list(band))


def _unmet_slo(ctx: RuleContext) -> str:
    """Why no cost stands in the headline when a fitted model says this workload cannot be
    served at the SLO (empty otherwise)."""
    for engine, bench in sorted(ctx.benches.items()):
        capacity = bench.capacity.workload_capacity_rps if bench.capacity else None
        if bench.cost_basis == "workload" and isinstance(capacity, Unknown):
            return f": cost at the SLO unknown for this workload ({ctx.name(engine)}: {capacity.reason})"
    return ""


def _headline(
    ctx: RuleContext,
    top: str | None,
    runner: str | None,
    outcome: Outcome,
    routing: Routing,
    isolation: IsolationAdvice | None,
    previous: Any,
) -> str:
    if top is None:
        return "No engine recommended: " + "; ".join(outcome.reasons)
    text = ctx.name(top)
    lacking = uncovered(ctx, top)
    if lacking:
        served = [t for t in ctx.requirements.hardware if t not in lacking]
        text += (
            f" for the {', '.join(served)} part of the fleet (the {', '.join(lacking)} part "
            "needs another engine)"
        )
    if routing.recommended and routing.layer:
        text += f" with prefix-aware routing ({ctx.catalog.layers[routing.layer].name})"
    elif routing.recommended:
        text += " with prefix-aware routing (its layer depends on your platform: see routing)"
    bench = ctx.benches.get(top)
    if bench and bench.cost_per_1m_output_usd is not None:
        text += f": {usd(bench.cost_per_1m_output_usd)} per 1M output tokens at the SLO"
        if bench.cost_basis == "workload" and bench.workload_cost is not None:
            cost = bench.workload_cost
            text += (
                f" for this workload ({cost.gpus} GPU{'s' if cost.gpus != 1 else ''} at its peak, "
                f"{money(cost.monthly_cost_usd)}/month; the benchmark's own figure "
                f"{usd(bench.benchmark_cost_per_1m_output_usd)})"
            )
        else:
            text += " on the benchmark's own mix"
    else:
        text += _unmet_slo(ctx)
    text += f" ({outcome.confidence}"
    if runner:
        text += f"; runner-up {ctx.name(runner)}"
    text += ")"
    if isolation is not None:
        text += f". Untrusted tenants: {isolation.action} ({isolation.cost})"
    current = current_engine(ctx)
    if current is not None and current != top and ctx.states[current].excluded:
        switch = switch_cost(ctx, top)
        text += f". Migrate from {ctx.name(current)}, keeping it running meanwhile" + (
            f" ({money(switch)} of migration work)" if switch is not None else ""
        )
    if previous is not None and previous.fired:
        text += f". Revisit: {len(previous.fired)} trigger(s) fired since {previous.as_of or 'the previous decision'}"
    return text
