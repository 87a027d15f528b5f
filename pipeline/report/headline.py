"""The few figures that close a full run: one line per stage, read back from what each stage
wrote (through its ``read_*`` function, never by file name), for ``enginefit report``.

A stage whose outputs are missing or that had nothing to work on says so with the reason; a
figure the input cannot support is ``unknown``, never 0.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.bench import stage as bench_stage
from pipeline.bench.result import CapacityRow
from pipeline.capacity import stage as capacity_stage
from pipeline.capacity.result import CandidateCapacity, WorkloadCost
from pipeline.decision import stage as decision_stage
from pipeline.errors import EnginefitError
from pipeline.ingest import stage as ingest_stage
from pipeline.layout import WorkloadLayout
from pipeline.ledger import PDF, Filing
from pipeline.prefix import stage as prefix_stage
from pipeline.present.text import UNKNOWN, money, number, share, unknown_text, usd
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage
from pipeline.unknown import Unknown, is_known


def _ingest(layout: WorkloadLayout) -> str:
    summary = ingest_stage.read_summary(layout)
    span_h = summary.span_s / 3600
    return (
        f"{summary.ingested:,} requests ingested of {summary.records_read:,} read, "
        f"{summary.quarantined:,} quarantined; {span_h:,.1f} h from {summary.first_arrival}"
    )


def _shape(layout: WorkloadLayout) -> str:
    metrics = shape_stage.read_result(layout).metrics
    peaks = [
        f"{number(rate, 2, 'req/s')} ({name} window)"
        for name, rate in metrics.arrivals.peak_rates().items()
    ]
    concurrency = metrics.concurrency
    label = " (estimated)" if concurrency.estimated else ""
    return (
        f"peak rate {peaks[0] if peaks else UNKNOWN}; peak concurrency {concurrency.peak:,}{label}"
    )


def _prefix(layout: WorkloadLayout) -> str:
    summary = prefix_stage.read_result(layout).summary
    estimate = summary.estimate
    sampled = estimate is not None and estimate.reuse is not None and estimate.reuse.shared
    return (
        f"curve shape: {summary.classification.shape}; an unbounded prefix cache could "
        f"serve {share(summary.reuse.hit_share)} of prompt tokens"
        + (" (estimated)" if sampled else "")
    )


def _simulation(layout: WorkloadLayout) -> str:
    summaries = sim_stage.read_summaries(layout)
    known = [(s.hit_ratio, s.scenario) for s in summaries if is_known(s.hit_ratio)]
    if not summaries:
        return "no scenarios configured"
    first = summaries[0].hit_ratio
    if not known:
        reason = first.reason if isinstance(first, Unknown) else "the trace cannot support it"
        return f"{len(summaries)} scenarios; hit ratio {UNKNOWN}: {reason}"
    (low, low_key), (high, high_key) = min(known), max(known)
    return (
        f"{len(summaries)} scenarios; hit ratio {share(low)} ({low_key}) to "
        f"{share(high)} ({high_key})"
    )


def _bench(layout: WorkloadLayout) -> str:
    analysis = bench_stage.read_analysis(layout)
    if analysis.capacity.is_empty():
        return f"skipped: {analysis.notes[0]}" if analysis.notes else "no benchmark candidates"
    return "; ".join(_candidate(row) for row in analysis.capacity_rows(ranked=True))


def _candidate(row: CapacityRow) -> str:
    cost = row.cost_per_1m_output_usd
    return (
        f"{row.candidate}: capacity {number(row.capacity_rps, 2, 'req/s')}, "
        + (f"{usd(cost)} per 1M output tokens" if cost is not None else f"cost {UNKNOWN}")
        + f" ({row.rank_pool or 'unranked'})"
    )


def _capacity(layout: WorkloadLayout) -> str:
    result = capacity_stage.read_result(layout)
    if not result.candidates:
        return result.notes[0] if result.notes else "no benchmarked deployment"
    return "; ".join(_carried(c) for c in result.candidates)


def _carried(candidate: CandidateCapacity) -> str:
    capacity = candidate.workload_capacity_rps
    if isinstance(capacity, Unknown):
        return f"{candidate.candidate}: capacity {unknown_text(capacity)}"
    cost = candidate.cost
    priced = (
        f"{cost.replicas} replica(s) at peak, {money(cost.monthly_cost_usd)}/month, "
        f"{usd(cost.cost_per_1m_output_usd)} per 1M output tokens of this workload"
        if isinstance(cost, WorkloadCost)
        else f"cost {unknown_text(cost)}"
    )
    return (
        f"{candidate.candidate}: {number(capacity, 2, 'req/s')} per replica at this mix "
        f"({candidate.capacity_basis}), {priced}"
    )


def _decision(layout: WorkloadLayout) -> str:
    return decision_stage.read_record(layout).recommendation.headline


def _report(layout: WorkloadLayout, filing: Filing) -> str:
    tree = filing.tree
    quarter = filing.quarter_for(ingest_stage.read_summary(layout).last_arrival)
    latest = tree.latest(quarter)
    if latest is None:
        return f"no version of {quarter} published yet"
    return f"{quarter} v{latest.version}: {tree.root / latest.path / PDF}"


HEADLINES: tuple[tuple[str, Callable[[WorkloadLayout], str]], ...] = (
    ("ingest", _ingest),
    ("shape", _shape),
    ("prefix", _prefix),
    ("simulation", _simulation),
    ("bench", _bench),
    ("capacity", _capacity),
    ("decision", _decision),
)


def headlines(layout: WorkloadLayout, filing: Filing) -> list[tuple[str, str]]:
    """``(stage, line)`` for every stage of the workload, the report filed in ``filing`` last."""
    lines = []
    for stage, headline in (*HEADLINES, ("report", lambda layout: _report(layout, filing))):
        try:
            line = headline(layout)
        except EnginefitError as exc:
            line = f"not available ({exc})"
        lines.append((stage, line))
    return lines


def headline_table(lines: list[tuple[str, str]]) -> str:
    width = max(len(stage) for stage, _ in lines)
    return "\n".join(f"  {stage:<{width}}  {line}" for stage, line in lines)
