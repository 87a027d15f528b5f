"""The few figures that close a full run: one line per stage, read back from what each stage
wrote (through its ``read_*`` function, never by file name), for ``enginefit report``.

A stage whose outputs are missing or that had nothing to work on says so with the reason; a
figure the input cannot support is ``unknown``, never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.bench import stage as bench_stage
from pipeline.config import Config
from pipeline.decision import stage as decision_stage
from pipeline.errors import EnginefitError
from pipeline.ingest import stage as ingest_stage
from pipeline.layout import WorkloadLayout
from pipeline.prefix import stage as prefix_stage
from pipeline.report.versions import PDF, report_quarter, report_tree
from pipeline.shape import stage as shape_stage
from pipeline.sim import stage as sim_stage


def _ingest(layout: WorkloadLayout, config: Config) -> str:
    summary = ingest_stage.read_summary(layout)
    span_h = summary.span_s / 3600
    return (
        f"{summary.ingested:,} requests ingested of {summary.records_read:,} read, "
        f"{summary.quarantined:,} quarantined; {span_h:,.1f} h from {summary.first_arrival}"
    )


def _shape(layout: WorkloadLayout, config: Config) -> str:
    metrics = shape_stage.read_result(layout).metrics
    windows = metrics["arrivals"]["windows"]
    peaks = [
        f"{w['peak_rate_rps']:,.2f} req/s ({name} window)"
        for name, w in windows.items()
        if w.get("supported") and w.get("peak_rate_rps") is not None
    ]
    concurrency = metrics["concurrency"]
    label = " (estimated)" if concurrency.get("estimated") else ""
    return (
        f"peak rate {peaks[0] if peaks else 'unknown'}; peak concurrency "
        f"{concurrency['peak']:,}{label}"
    )


def _prefix(layout: WorkloadLayout, config: Config) -> str:
    summary = prefix_stage.read_result(layout).summary
    share = summary["reuse"].get("hit_share")
    served = f"{share:.1%}" if share is not None else "unknown"
    return (
        f"curve shape: {summary['classification']['shape']}; an unbounded prefix cache could "
        f"serve {served} of prompt tokens"
    )


def _simulation(layout: WorkloadLayout, config: Config) -> str:
    summaries = sim_stage.read_summaries(layout)
    known = [s for s in summaries if s.get("hit_ratio") is not None]
    if not summaries:
        return "no scenarios configured"
    if not known:
        reason = summaries[0].get("hit_unknown_reason") or "the trace cannot support it"
        return f"{len(summaries)} scenarios; hit ratio unknown: {reason}"
    low = min(known, key=lambda s: (s["hit_ratio"], s["scenario"]))
    high = max(known, key=lambda s: (s["hit_ratio"], s["scenario"]))
    return (
        f"{len(summaries)} scenarios; hit ratio {low['hit_ratio']:.1%} ({low['scenario']}) to "
        f"{high['hit_ratio']:.1%} ({high['scenario']})"
    )


def _bench(layout: WorkloadLayout, config: Config) -> str:
    analysis = bench_stage.read_analysis(layout, config.bench)
    if analysis.capacity.is_empty():
        return f"skipped: {analysis.notes[0]}" if analysis.notes else "no benchmark candidates"
    rows = analysis.capacity.sort("rank_pool", "cost_rank", "candidate", nulls_last=True)
    return "; ".join(_candidate(row) for row in rows.iter_rows(named=True))


def _candidate(row: dict[str, Any]) -> str:
    capacity = row.get("capacity_rps")
    cost = row.get("cost_per_1m_output_usd")
    return (
        f"{row['candidate']}: capacity "
        + (f"{capacity:,.2f} req/s" if capacity is not None else "unknown")
        + ", "
        + (f"${cost:,.4f} per 1M output tokens" if cost is not None else "cost unknown")
        + f" ({row.get('rank_pool') or 'unranked'})"
    )


def _decision(layout: WorkloadLayout, config: Config) -> str:
    return decision_stage.read_record(layout).recommendation.headline


def _report(layout: WorkloadLayout, config: Config) -> str:
    tree = report_tree(config)
    quarter = report_quarter(config, ingest_stage.read_summary(layout).last_arrival)
    latest = tree.latest(quarter)
    if latest is None:
        return f"no version of {quarter} published yet"
    return f"{quarter} v{latest.version}: {tree.root / latest.path / PDF}"


HEADLINES: tuple[tuple[str, Callable[[WorkloadLayout, Config], str]], ...] = (
    ("ingest", _ingest),
    ("shape", _shape),
    ("prefix", _prefix),
    ("simulation", _simulation),
    ("bench", _bench),
    ("decision", _decision),
    ("report", _report),
)


def headlines(config: Config) -> list[tuple[str, str]]:
    """``(stage, line)`` for every stage of the configured workload."""
    layout = config.layout()
    lines = []
    for stage, headline in HEADLINES:
        try:
            line = headline(layout, config)
        except EnginefitError as exc:
            line = f"not available ({exc})"
        lines.append((stage, line))
    return lines


def headline_table(lines: list[tuple[str, str]]) -> str:
    width = max(len(stage) for stage, _ in lines)
    return "\n".join(f"  {stage:<{width}}  {line}" for stage, line in lines)
