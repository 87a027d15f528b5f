"""The simulation for a person: tables and deterministic SVG figures."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline.present.figures import COLORS, LINESTYLES, MARKERS, SMALL_FONT, drawing, svg_bytes
from pipeline.present.tables import markdown_table
from pipeline.present.text import sample_rate

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def curve_sampling(curves: pl.DataFrame) -> tuple[float, float | None] | None:
    """The rate and estimated hit-ratio error of sampled capacity curves (the thinnest rate,
    the largest error), None when every curve is exact."""
    if "sample_rate" not in curves.columns:
        return None
    sampled = curves.filter(pl.col("sample_rate") < 1)
    if sampled.is_empty():
        return None
    error = sampled["hit_ratio_error"].max()
    return float(sampled["sample_rate"].min()), None if error is None else float(error)  # type: ignore[arg-type]


def curve_sampling_brief(curves: pl.DataFrame) -> str | None:
    """A sampled curve's rate and error in a clause (None when exact)."""
    found = curve_sampling(curves)
    if found is None:
        return None
    rate, error = found
    within = f", estimated within ±{error:.3f} hit ratio" if error is not None else ""
    return f"from a {sample_rate(rate)} SHARDS spatial sample of blocks{within}"


def curve_sampling_note(curves: pl.DataFrame) -> str | None:
    """What a sampled capacity curve is, said where the curve appears (None when exact)."""
    found = curve_sampling(curves)
    if found is None:
        return None
    rate, error = found
    within = (
        f"estimated within ±{error:.3f} hit ratio of the exact curve (the largest gap between "
        "the sample's curve and each of its two independent halves'), coarsest below about "
        f"{100 / rate:,.0f} blocks per replica"
        if error is not None
        else "its error is unknown"
    )
    return (
        f"The capacity curves' hit ratios come from a {sample_rate(rate)} spatial sample of cache blocks "
        "(SHARDS, Waldspurger et al., FAST 2015), the trace being too large to replay every "
        f"block in memory: {within}. The simulated scenarios' figures are exact."
    )


#: The scenario columns a person reads first (scenarios.parquet has them all).
SCENARIO_VIEW = (
    "scenario",
    "routing",
    "replicas",
    "cache_tokens",
    "request_lifetime",
    "shed_requests",  # only when the timeout shed some
    "hit_ratio",
    "hit_ratio_instant",
    "content_share",
    "token_imbalance",
    "spills",
    "balance_routed",
)


def scenarios_table(scenarios: pl.DataFrame) -> str:
    return markdown_table(scenarios, [c for c in SCENARIO_VIEW if c in scenarios.columns])


def scenario_warnings(scenarios: pl.DataFrame) -> list[str]:
    """Each scenario's warnings (shed requests, blocks pinned past the cache, estimated
    durations) as lines naming the scenario, in table order; each sentence said once."""
    if "warnings" not in scenarios.columns:
        return []
    said: dict[str, list[str]] = {}
    for name, warnings in scenarios.select("scenario", "warnings").iter_rows():
        for warning in warnings or []:
            said.setdefault(warning, []).append(name)
    return [f"warning ({', '.join(names)}): {warning}" for warning, names in said.items()]


def curves_table(points: list[dict[str, Any]]) -> str:
    """One row per curve: where it saturates and at what hit ratio."""
    return markdown_table(
        points,
        [
            "block_size",
            "replicas",
            "routing",
            "max_hit_ratio",
            "saturation_cache_tokens",
            "content_share",
        ],
    )


def coverage_note(*tables: pl.DataFrame) -> tuple[str, bool] | None:
    """What the tables' hit ratios are, and whether they are unknown: unknown (and why) when
    the trace has no prompt content, over the requests with content when only some carry it;
    None when every request does (one trace feeds every table, so they agree)."""
    reasons = sorted(
        {r for t in tables if "hit_unknown_reason" in t.columns for r in t["hit_unknown_reason"]}
        - {None}
    )
    if reasons:
        return f"hit ratio unknown: {reasons[0]}", True
    shares = [
        share
        for t in tables
        if "content_share" in t.columns
        for share in t["content_share"].drop_nulls()
    ]
    if shares and min(shares) < 1:
        note = (
            "hit ratio over the requests with prompt content "
            f"({min(shares):.1%} of prompt tokens); the others' hits are unknown"
        )
        return note, False
    return None


def _annotate(ax: Axes, *tables: pl.DataFrame) -> None:
    """The coverage note: across the (empty) plot when the hits are unknown, else below it."""
    coverage = coverage_note(*tables)
    if coverage is None:
        return
    note, unknown = coverage
    if unknown:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            textwrap.fill(note, 48),
            ha="center",
            va="center",
            transform=ax.transAxes,
            bbox={"facecolor": "white", "edgecolor": "grey"},
        )
    else:
        ax.text(
            0.0,
            -0.2,
            textwrap.fill(note, 90),
            fontsize=SMALL_FONT,
            va="top",
            transform=ax.transAxes,
        )


def hit_ratio_vs_capacity_svg(curves: pl.DataFrame, scenarios: pl.DataFrame) -> bytes:
    """Hit ratio against cache tokens per replica: a line per curve (instant lifetime), a
    marker per multi-replica scenario (its own lifetime); unknown hit ratios are not drawn, and
    the plot says why (an annotated empty plot when nothing is known)."""
    with drawing(7.5, 4.5) as fig:
        ax = fig.subplots()
        _annotate(ax, curves, scenarios)
        curves = curves.filter(pl.col("hit_ratio").is_not_null())
        scenarios = scenarios.filter(pl.col("hit_ratio").is_not_null())
        groups = curves.sort("capacity_blocks").group_by(
            ["block_size", "replicas", "routing"], maintain_order=True
        )
        for i, ((bs, reps, routing), part) in enumerate(groups):
            label = f"{routing}, R={reps}, B={bs}" if reps > 1 else f"one replica, B={bs}"
            ax.step(
                part["cache_tokens"],
                part["hit_ratio"],
                where="post",
                label=label,
                lw=1.2,
                color=COLORS[i % len(COLORS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)],
            )
        by_routing = scenarios.sort("routing", "cache_tokens").group_by(
            ["routing"], maintain_order=True
        )
        for i, ((routing,), part) in enumerate(by_routing):
            multi = part.filter(pl.col("replicas") > 1)
            if multi.height:
                ax.plot(
                    multi["cache_tokens"],
                    multi["hit_ratio"],
                    MARKERS[i % len(MARKERS)],
                    ms=7 - i % 3,
                    mfc="none",
                    color="black",
                    label=f"{routing} scenarios (R>1)",
                )
        if curves.height:
            ax.set_xscale("log")
        ax.set_xlabel("prefix-cache capacity per replica (tokens)")
        ax.set_ylabel("prompt tokens served from cache")
        ax.set_ylim(0, 1)
        # Grid lines at the decades only: the minor ticks still mark 2..9 on the log axis, and a
        # line per minor tick would add elements without helping the reading.
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # nothing drawn (no replayed hits): no legend
            ax.legend(fontsize=SMALL_FONT, loc="upper left")
        ax.set_title("Hit ratio vs cache capacity, by routing")
        return svg_bytes(fig)


def imbalance_vs_hit_ratio_svg(scenarios: pl.DataFrame) -> bytes:
    """Token load imbalance (max/mean over replicas) against hit ratio, one marker per routing
    (scenarios whose hit ratio is unknown are not drawn; the plot says why)."""
    with drawing(6.5, 4.5) as fig:
        ax = fig.subplots()
        _annotate(ax, scenarios)
        multi = scenarios.filter(pl.col("replicas") > 1, pl.col("hit_ratio").is_not_null()).sort(
            "routing", "scenario"
        )
        for i, ((routing,), part) in enumerate(multi.group_by(["routing"], maintain_order=True)):
            ax.plot(
                part["hit_ratio"],
                part["token_imbalance"],
                MARKERS[i % len(MARKERS)],
                ms=7,
                color=COLORS[i % len(COLORS)],
                label=str(routing),
            )
        ax.set_xlabel("hit ratio (prompt tokens served from cache)")
        ax.set_ylabel("token load imbalance (max / mean)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(True, alpha=0.3)
        if multi.height:
            ax.legend(fontsize=SMALL_FONT)
        ax.set_title("Cache affinity vs load balance")
        return svg_bytes(fig)
