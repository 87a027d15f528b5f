"""The bench analysis for a person: the text summary, Markdown tables and SVG figures.

Figures (deterministic, :mod:`pipeline.present.figures`):

- :func:`latency_vs_load_svg`: TTFT and ITL percentiles (p50, p95, p99) versus offered load per
  candidate, log latency axis, with the SLO limits as dashed lines and each point's status.
- :func:`cost_svg`: cost per 1M output tokens at the SLO per candidate (interpolated bars hatched),
  grouped by rank pool: lower-bound and single-point capacities are coloured, labelled and set
  apart from the main (bracketed) ranking.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import polars as pl

from pipeline.bench.config import ITL_DEFINITIONS, SloSpec
from pipeline.bench.result import CAPACITY_TEXT_COLUMNS, BenchResult
from pipeline.costing import COST_FORMULA, FLEET_FORMULA
from pipeline.present.figures import COLORS, SMALL_FONT, drawing, svg_bytes
from pipeline.present.tables import cell, markdown_table, text_table, wrapped

_STYLES: dict[str, Any] = {"p50": ":", "p95": "-", "p99": "--"}
_MARKERS = {"pass": "o", "fail": "X", "unknown": "s"}


def _panels(slo: SloSpec) -> list[tuple[str, str]]:
    """(family column prefix, title) for TTFT and the SLO's ITL definition."""
    itl = ITL_DEFINITIONS[slo.itl_definition]
    return [("ttft", "TTFT"), (itl, f"ITL ({slo.itl_definition})")]


def latency_vs_load_svg(evaluated: pl.DataFrame, slo: SloSpec) -> bytes:
    """TTFT / ITL percentiles versus offered load (open-loop points only), one colour per
    candidate, SLO limits dashed in black. Status markers sit on the limited percentile."""
    with drawing(7.5, 4.2) as fig:
        axes = fig.subplots(1, 2)
        points = evaluated.filter(pl.col("sweep") == "open").sort(["candidate", "load"])
        candidates: Sequence[str] = sorted(points.get_column("candidate").unique().to_list())
        for ax, (family, title) in zip(axes, _panels(slo), strict=True):
            limited = {
                lim.stat: lim.max_ms
                for lim in slo.limits
                if lim.column(slo.itl_definition).startswith(f"{family}_")
            }
            plotted = False
            for i, cand in enumerate(candidates):
                rows = points.filter(pl.col("candidate") == cand)
                color = COLORS[i % len(COLORS)]
                for stat, style in _STYLES.items():
                    col = f"{family}_{stat}_ms"
                    if col not in rows.columns:
                        continue
                    sub = rows.filter(pl.col(col).is_not_null() & (pl.col(col) > 0))
                    if sub.height == 0:
                        continue
                    ax.plot(
                        sub.get_column("load").to_list(),
                        sub.get_column(col).to_list(),
                        linestyle=style,
                        color=color,
                        linewidth=1.2,
                    )
                    plotted = True
                    if stat in limited:
                        for status, marker in _MARKERS.items():
                            hit = sub.filter(pl.col("slo_status") == status)
                            if hit.height:
                                ax.scatter(
                                    hit.get_column("load").to_list(),
                                    hit.get_column(col).to_list(),
                                    marker=marker,
                                    color=color,
                                    s=28,
                                    zorder=3,
                                )
            for stat, bound in sorted(limited.items()):
                ax.axhline(bound, color="black", linestyle="--", linewidth=0.9)
                ax.annotate(
                    f"SLO {stat} ≤ {bound:g} ms",
                    xy=(0.01, bound),
                    xycoords=("axes fraction", "data"),
                    fontsize=SMALL_FONT,
                    va="bottom",
                )
            if plotted or limited:
                ax.set_yscale("log")
            ax.set_xlabel("offered load (req/s)")
            ax.set_ylabel(f"{title} (ms)")
            ax.set_title(f"{title} vs offered load")
            ax.grid(True, which="major", alpha=0.3)  # minor ticks, no minor grid lines
            if not plotted:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        from matplotlib.lines import Line2D  # import here: matplotlib loads with the figure

        handles = [
            # A long candidate label wrapped: the legend would widen the saved figure otherwise.
            Line2D(
                [], [], color=COLORS[i % len(COLORS)], linewidth=2, label=textwrap.fill(cand, 44)
            )
            for i, cand in enumerate(candidates)
        ]
        handles += [
            Line2D([], [], color="grey", linestyle=style, label=stat)
            for stat, style in _STYLES.items()
        ]
        handles += [
            Line2D([], [], color="grey", marker=m, linestyle="none", label=status)
            for status, m in _MARKERS.items()
        ]
        handles.append(Line2D([], [], color="black", linestyle="--", label="SLO limit"))
        rows_needed = -(-len(handles) // 4)
        # A wrapped candidate label makes its legend row taller by its extra lines.
        extra_lines = max((len(textwrap.wrap(c, 44)) - 1 for c in candidates), default=0)
        fig.subplots_adjust(
            bottom=0.14 + 0.045 * (rows_needed + extra_lines), top=0.86, wspace=0.25
        )
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=4,
            fontsize=SMALL_FONT,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
        )
        # Wrapped: an unwrapped title wider than the axes widens the saved figure and shrinks
        # everything else when it is fitted to the page.
        fig.suptitle(textwrap.fill(f"SLO: {slo.describe()}", 100), fontsize=9)
        return svg_bytes(fig)


#: Rank pools in chart order, with the bar colour and the tag written beside the bar.
_POOLS: dict[str, tuple[str, str]] = {
    "bracketed": (COLORS[0], ""),
    "lower_bound": (COLORS[4], " [lower bound: no failure seen; ranked apart]"),
    "single_point": ("#7f7f7f", " [single load point; ranked apart]"),
}


def cost_svg(capacity: pl.DataFrame, *, comparable: bool = True) -> bytes:
    """Cost per 1M output tokens at the SLO capacity, one bar per open-loop candidate, grouped
    by rank pool (bracketed first; lower bounds and single-point capacities apart, labelled)."""
    with drawing(7.5, 3) as fig:
        rows = capacity.filter(
            (pl.col("sweep") == "open") & pl.col("cost_per_1m_output_usd").is_not_null()
        )
        if "rank_pool" not in rows.columns:
            rows = rows.with_columns(rank_pool=pl.lit("bracketed"))
        order = {pool: i for i, pool in enumerate(_POOLS)}
        rows = rows.with_columns(
            _order=pl.col("rank_pool").replace_strict(order, default=len(order))
        ).sort(["_order", "cost_per_1m_output_usd", "candidate"])
        fig.set_size_inches(8, 0.6 + 0.5 * max(rows.height, 1))
        ax = fig.subplots()
        if rows.height == 0:
            ax.text(0.5, 0.5, "no candidate has a cost at the SLO", ha="center", va="center")
            ax.set_axis_off()
            return svg_bytes(fig)
        labels = rows.get_column("candidate").to_list()
        costs = rows.get_column("cost_per_1m_output_usd").to_list()
        interp = rows.get_column("interpolated").to_list()
        pools = rows.get_column("rank_pool").to_list()
        y = list(range(len(labels)))
        colors = [_POOLS.get(pool, ("#7f7f7f", ""))[0] for pool in pools]
        bars = ax.barh(y, costs, color=colors)
        for bar, is_interp in zip(bars, interp, strict=True):
            if is_interp:
                bar.set_hatch("//")
                bar.set_alpha(0.6)
        for yi, cost, is_interp, pool in zip(y, costs, interp, pools, strict=True):
            tag = " (interpolated)" if is_interp else ""
            tag += _POOLS.get(pool, ("", f" [{pool}]"))[1]
            ax.text(cost, yi, f" ${cost:.3f}{tag}", va="center", fontsize=SMALL_FONT)
        for yi in range(1, len(pools)):
            if pools[yi] != pools[yi - 1]:  # a rule between pools: they are not one ranking
                ax.axhline(yi - 0.5, color="black", linewidth=0.8, linestyle=":")
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlabel("$ per 1M output tokens at the SLO capacity")
        ax.set_xlim(0, max(costs) * 1.9)
        title = "Cost per 1M output tokens at the SLO"
        if not comparable:
            title += " — NOT COMPARABLE (see validity findings)"
        ax.set_title(title)
        return svg_bytes(fig)


# ------------------------------------------------------------------------------------ tables

#: The load-point columns shown in Dagster's metadata.
POINT_VIEW = (
    "point_id",
    "engine",
    "gpu_type",
    "gpu_count",
    "load_mode",
    "offered_rate_rps",
    "achieved_rate_rps",
    "ttft_p95_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
)


def capacity_table(analysis: BenchResult) -> str:
    return markdown_table(analysis.capacity, CAPACITY_TEXT_COLUMNS)


def fleet_table(analysis: BenchResult) -> str:
    return markdown_table(analysis.fleet)


def findings_table(analysis: BenchResult) -> str:
    """The findings that are not ok (flags and unknowns), with their messages."""
    flagged = analysis.findings.filter(pl.col("status") != "ok")
    return markdown_table(flagged, ["candidate", "check", "status", "message"])


#: The terminal text's width: the key columns fit; every column is in ``--json`` / Parquet.
TEXT_WIDTH = 100
_SWEEP_ORDER = {"open": 0, "closed": 1, "other": 2}


def _candidate_numbers(analysis: BenchResult) -> dict[str, int]:
    """``[n]`` for each candidate label, in label order (the labels are long: one legend)."""
    labels = sorted(set(analysis.capacity.get_column("candidate").drop_nulls().to_list()))
    return {label: i for i, label in enumerate(labels, start=1)}


def _load_text(sweep: str | None, load: float | None, arrival: str | None) -> str:
    """A point's load as the capacity pattern writes it (two decimals at most), with its unit."""
    if load is None or sweep not in ("open", "closed"):
        return arrival or "—"
    if sweep == "open":
        return f"{round(load, 2):g} req/s"
    return f"{round(load, 2):g} user{'' if load == 1 else 's'}"


def _capacity_table(rows: list[dict[str, Any]], numbers: dict[str, int]) -> list[str]:
    table = [
        [
            f"[{numbers.get(r['candidate'], '?')}]",
            r["sweep"],
            r["capacity_status"],
            _load_text(r["sweep"], r["capacity_load"], None),
            cell(r["capacity_rps"]),
            cell(r["output_throughput_tps"]),
            cell(r["gpu_hour_usd"]),
            cell(r["cost_per_1m_output_usd"]),
            f"{r['cost_rank']} {r['rank_pool']}" if r.get("cost_rank") is not None else "—",
        ]
        for r in rows
    ]
    headers = ["#", "sweep", "capacity", "at load", "req/s", "out tok/s", "$/GPU-h", "$/1M out"]
    return text_table(table, [*headers, "rank"])


def _capacity_lines(analysis: BenchResult, numbers: dict[str, int], width: int) -> list[str]:
    """Open-loop candidates (the ranking), then closed-loop and burst results apart; under each
    table, per candidate: its points, price source and notes."""
    rows = sorted(
        analysis.capacity.iter_rows(named=True),
        key=lambda r: (_SWEEP_ORDER.get(r["sweep"], 3), numbers.get(r["candidate"], 0)),
    )
    lines: list[str] = []
    for title, group in (
        ("Open loop (ranked within pools)", [r for r in rows if r["sweep"] == "open"]),
        (
            "Closed loop and bursts, reported apart (not ranked: a closed loop waits for the "
            "server, which hides queueing; a burst has no single rate)",
            [r for r in rows if r["sweep"] != "open"],
        ),
    ):
        if not group:
            continue
        lines += ["", *wrapped(title, width), *_capacity_table(group, numbers)]
        for r in group:
            detail = f"points (load:P pass, F fail, ? unknown) {r['pattern']}"
            detail += f"; price: {r['price_source']}"
            if r.get("note"):
                detail += f"; {r['note']}"
            lines += wrapped(
                f"[{numbers.get(r['candidate'], '?')}] {r['sweep']}: {detail}",
                width,
                "  ",
                "      ",
            )
    return lines


def _point_lines(analysis: BenchResult, numbers: dict[str, int], width: int) -> list[str]:
    """Every point that did not pass, with the measured value against its limit."""
    points = analysis.evaluated.filter(pl.col("slo_status") != "pass").sort(
        ["candidate", "sweep", "load", "point_id"], nulls_last=True
    )
    if points.height == 0:
        return ["  none: every load point passed"]
    lines: list[str] = []
    for r in points.iter_rows(named=True):
        load = _load_text(r["sweep"], r["load"], r.get("arrival_process"))
        text = f"[{numbers.get(r['candidate'], '?')}] {load}: {r['slo_status']}: {r['slo_reason']}"
        lines += wrapped(text, width, "  ", "      ")
    return lines


def _fleet_lines(analysis: BenchResult, numbers: dict[str, int]) -> list[str]:
    rows = [
        [
            f"[{numbers.get(r['candidate'], '?')}]",
            r["sweep"],
            r["rate_label"],
            cell(r["rate_rps"]),
            cell(r["replicas"]),
            cell(r["gpus"]),
            cell(r["monthly_usd"]),
        ]
        for r in analysis.fleet.iter_rows(named=True)
    ]
    return text_table(rows, ["#", "sweep", "rate", "req/s", "replicas", "GPUs", "$/month"])


def _finding_lines(analysis: BenchResult, numbers: dict[str, int], width: int) -> list[str]:
    flagged = analysis.findings.filter(pl.col("status") != "ok")
    if flagged.height == 0:
        return ["  none"]
    lines: list[str] = []
    for r in flagged.iter_rows(named=True):
        who = f"[{numbers[r['candidate']]}]" if r["candidate"] in numbers else "[all]"
        lines += wrapped(f"{who} {r['check']} {r['status']}: {r['message']}", width, "  ", "      ")
    return lines


#: The benchmark's figures are its own request mix's; this workload's are the capacity stage's.
WORKLOAD_POINTER = (
    "These figures are each benchmark's own request mix. This workload's own capacity at the "
    "SLO, fleet and cost per 1M tokens (each serving model carried to its traffic): "
    "`enginefit capacity`."
)


def render_text(analysis: BenchResult, width: int = TEXT_WIDTH) -> str:
    """The terminal summary, at most ``width`` columns: what was used (SLO, date, workload
    facts, prices), capacity and cost per candidate, the points that did not pass with the
    measured value against the limit, fleet, findings that are not ok, notes."""
    numbers = _candidate_numbers(analysis)
    as_of = analysis.as_of.isoformat() if analysis.as_of else "not given (age unknown)"
    lines: list[str] = []
    for text in (
        f"SLO: {analysis.settings.slo.describe()}",
        f"as of: {as_of}",
        f"workload facts: {analysis.facts_source}",
        f"prices ($/GPU-hour): {analysis.prices_source}",
        COST_FORMULA,
    ):
        lines += wrapped(text, width)
    lines += ["", "Candidates"]
    for label, n in numbers.items():
        lines += wrapped(f"[{n}] {label}", width, "  ", "      ")
    if not numbers:
        lines.append("  none")
    else:
        lines += [
            "",
            "Capacity at the SLO and cost per 1M output tokens, at each benchmark's own mix",
        ]
        lines += _capacity_lines(analysis, numbers, width)[1:]
        lines += ["", "Load points that did not pass (measured value against the limit)"]
        lines += _point_lines(analysis, numbers, width)
    if analysis.fleet.height:
        lines += [
            "",
            "Fleet at the workload's rates if its requests were the benchmark's",
            *wrapped(FLEET_FORMULA, width, "  ", "  "),
        ]
        lines += _fleet_lines(analysis, numbers)
    lines += ["", "Validity findings (flag / unknown)"]
    lines += _finding_lines(analysis, numbers, width)
    if analysis.notes:
        lines += ["", "Notes"]
        for note in analysis.notes:
            lines += wrapped(f"- {note}", width, "  ", "    ")
    lines += [
        "",
        *wrapped(WORKLOAD_POINTER, width),
        *wrapped(
            "Every column (cost workings, noise, keep-up, repeats): --json, or --out DIR "
            "(bench/*.parquet, bench_analysis.json).",
            width,
        ),
    ]
    return "\n".join(lines)


def figures(analysis: BenchResult) -> dict[str, bytes]:
    """Every bench figure by layout name."""
    return {
        "latency_svg": latency_vs_load_svg(analysis.evaluated, analysis.settings.slo),
        "cost_svg": cost_svg(analysis.capacity, comparable=analysis.comparable),
    }
