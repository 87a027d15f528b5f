"""The whole bench analysis: SLO status per point, capacity and cost per candidate, the fleet
for the workload's rates, and the validity findings, from load points, settings and facts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import polars as pl

from pipeline.bench.config import BenchConfig
from pipeline.bench.cost import cost_gap_vs_noise, cost_per_million, fleet_cost, workload_rates
from pipeline.bench.result import AnalysisBasis, BenchResult
from pipeline.bench.slo import candidate_keys, evaluate_slo, slo_capacity
from pipeline.bench.validity import candidate_label_expr, comparability, validity_findings
from pipeline.shape.facts import WorkloadFacts

#: Which ranking a candidate's cost belongs to (null: no cost at the SLO, or not open loop).
RANK_POOL = (
    pl.when((pl.col("sweep") != "open") | pl.col("cost_per_1m_output_usd").is_null())
    .then(None)
    .when(pl.col("n_loads") == 1)
    .then(pl.lit("single_point"))
    .when(pl.col("capacity_status") == "bracketed")
    .then(pl.lit("bracketed"))
    .when(pl.col("capacity_status") == "not_bracketed")
    .then(pl.lit("lower_bound"))
)


def analyse_bench(
    load_points: pl.DataFrame,
    settings: BenchConfig,
    facts: WorkloadFacts | None = None,
    *,
    as_of: dt.date | None = None,
    notes: Sequence[str] = (),
    per_request: pl.DataFrame | None = None,
) -> BenchResult:
    """SLO status per point, capacity and cost per candidate, fleet per rate, validity findings.

    ``as_of`` (for the age check) defaults to ``settings.as_of``; the caller (CLI / asset)
    passes the run's date, never this function's clock. ``per_request`` (the reader's
    per-request table) lets the keep-up check use request send times.

    Candidates are ranked by cost per 1M output tokens within their ``rank_pool`` only:
    ``bracketed`` (a pass below a failure: the main ranking), ``lower_bound`` (no failure seen,
    so the capacity and cost are only bounds) and ``single_point`` (one load tried); never mixed.
    """
    when = as_of or settings.as_of
    evaluated = evaluate_slo(load_points, settings, per_request=per_request)
    keys = candidate_keys(evaluated)
    capacity = slo_capacity(evaluated, settings.slo, interpolate=settings.interpolate, keys=keys)
    costed = cost_per_million(capacity, settings.prices)
    comparable, differences = comparability(evaluated)
    costed = costed.with_columns(candidate=candidate_label_expr(costed), rank_pool=RANK_POOL)
    pooled = pl.col("rank_pool").is_not_null()
    costed = cost_gap_vs_noise(
        costed.with_columns(
            cost_rank=pl.when(pl.lit(comparable) & pooled)
            .then(
                pl.when(pooled)
                .then(pl.col("cost_per_1m_output_usd"))
                .rank("min")
                .over("rank_pool")
                .cast(pl.Int64)
            )
            .otherwise(None),
        )
    )
    rates = (
        workload_rates(facts.mean_rate_rps, facts.peak_rate_rps, settings.peak_window)
        if facts
        else {}
    )
    fleet = fleet_cost(costed, rates, keys)
    fleet = fleet.with_columns(candidate=candidate_label_expr(fleet)).select(
        "candidate", pl.exclude("candidate")
    )
    findings = validity_findings(evaluated, facts, settings, as_of=when, rates=rates)
    all_notes = [*notes, *_keep_up_notes(evaluated), *_rank_pool_notes(costed)]
    if not comparable:
        all_notes.append(
            "candidates are not comparable; no cost ranking: " + "; ".join(differences)
        )
    if facts is None:
        all_notes.append("no workload facts: fleet sizing and production checks skipped")
    return BenchResult(
        settings=AnalysisBasis.of(settings),
        as_of=when,
        evaluated=evaluated.with_columns(candidate=candidate_label_expr(evaluated)),
        capacity=costed.select("candidate", pl.exclude("candidate")),
        fleet=fleet,
        findings=findings,
        rates=rates,
        comparable=comparable,
        differences=differences,
        notes=all_notes,
    )


def _keep_up_notes(evaluated: pl.DataFrame) -> list[str]:
    """How many open-loop points kept up, were overloaded or could not be judged."""
    counts = dict(
        evaluated.filter(pl.col("sweep") == "open").group_by("keep_up_status").len().iter_rows()
    )
    if not counts:
        return []
    parts = [
        f"{counts.get(status, 0)} {label}"
        for status, label in (
            ("kept_up", "kept up"),
            ("overloaded", "overloaded (fail whatever their percentiles)"),
            ("unknown", "not judgeable (unknown)"),
        )
    ]
    return ["open-loop points: " + ", ".join(parts) + "; reasons: --json, points[].keep_up_reason"]


def _rank_pool_notes(costed: pl.DataFrame) -> list[str]:
    """Which candidates are ranked apart from the main (bracketed) cost ranking, and why."""
    why = {
        "lower_bound": "no failing load, so capacity and cost are only bounds",
        "single_point": "one load tried",
    }
    notes = []
    for pool, reason in why.items():
        names = costed.filter(pl.col("rank_pool") == pool).get_column("candidate").to_list()
        if names:
            notes.append(f"ranked apart as {pool} ({reason}): " + "; ".join(sorted(names)))
    return notes
