"""Prefix sharing for a person: Markdown tables, a text summary and the curve as SVG."""

from __future__ import annotations

import polars as pl

from pipeline.prefix.result import PrefixSummary
from pipeline.present.figures import COLORS, LINESTYLES, MARKERS, SMALL_FONT, drawing, svg_bytes
from pipeline.present.tables import markdown_table
from pipeline.present.text import UNKNOWN, number, sample_rate


def _pct(value: float | None) -> str:
    """A share as a percentage with a space before the sign (``12.3 %``)."""
    return number(None if value is None else 100 * float(value), 1, "%")


def curve_markdown(summary: PrefixSummary) -> str:
    """The sharing curve as a Markdown table (shares as percentages)."""
    return markdown_table(
        [
            {
                "window (tokens)": row.window_tokens,
                "share": _pct(row.share),
                "share (prompt ≥ W)": _pct(row.share_eligible),
                "token-weighted": _pct(row.token_share),
                "token-weighted (prompt ≥ W)": _pct(row.token_share_eligible),
            }
            for row in summary.curve
        ],
        max_rows=1000,
    )


def reuse_markdown(summary: PrefixSummary) -> str:
    """Reuse potential by cache retention, cross-tenant part, curve shape and sessions."""
    reuse = summary.reuse
    parts = [
        markdown_table(
            [
                {
                    "cache keeps a block after its last use": "forever"
                    if entry.max_age_s is None
                    else f"{entry.max_age_s:g} s",
                    "hit tokens": entry.hit_tokens,
                    "share of prompt tokens": _pct(entry.hit_share),
                }
                for entry in reuse.by_retention
            ]
        )
    ]
    needed = reuse.retention_needed_s
    if needed.p90 is not None:
        parts.append(
            f"To serve 50 / 90 / 99 % of these hits a cache must keep a prefix "
            f"{needed.p50:,.0f} / {needed.p90:,.0f} / {needed.p99:,.0f} s after its "
            "last use."
        )
    cross = reuse.cross_tenant
    if cross is not None:
        parts.append(
            f"Cross-tenant hits: {_pct(cross.cross_tenant_share_of_hits)} of hit tokens were "
            "served only because another tenant sent the prefix; per-tenant isolation would "
            f"serve {_pct(cross.isolated_hit_share)} of prompt tokens."
        )
    cls = summary.classification
    sess = summary.sessions
    kind = "inferred from prefix chains" if sess.inferred else "logged"
    parts += [
        f"Curve shape: **{cls.shape}** ({cls.reason}).",
        f"Sessions ({kind}): {sess.sessions:,}; turns per session p50 {sess.turns_p50}, "
        f"p99 {sess.turns_p99}, max {sess.turns_max}.",
    ]
    return "\n\n".join(parts)


def estimate_note(summary: PrefixSummary) -> str | None:
    """The sentence that says which of the figures the document shows (the curve, the
    unbounded cache's share of prompt tokens) are sampled, at what rate and within what
    standard error; None when both are exact."""
    estimate = summary.estimate
    if estimate is None:
        return None
    parts = []
    if estimate.curve is not None:
        errors = estimate.curve.sharing_standard_errors
        worst = max(
            (e / p.requests for e, p in zip(errors, summary.curve, strict=True) if p.requests),
            default=0.0,
        )
        parts.append(
            f"the shared-prefix curve from a {sample_rate(estimate.curve.rate)} spatial sample of its "
            f"prefix hashes (shares within ±{worst:.3f}, one standard error)"
        )
    reuse = estimate.reuse
    if reuse is not None and reuse.shared is not None:
        parts.append(
            f"the unbounded cache's share of prompt tokens from a {sample_rate(reuse.shared.rate)} "
            f"spatial sample of cache blocks (within ±{reuse.hit_share_standard_error or 0:.3f})"
        )
    if not parts:
        return None
    return (
        f"Estimated, the trace being too large to hold every prefix hash or block in memory: "
        f"{' and '.join(parts)} (SHARDS, Waldspurger et al., FAST 2015)."
    )


def summary_text(summary: PrefixSummary) -> str:
    """The summary for a terminal: counts, the curve table, reuse and sessions."""
    size = summary.block_size
    head = (
        f"{summary.requests:,} requests ({summary.requests_hashes_unknown:,} without "
        "prefix hashes), "
        + (f"block size {size} tokens" if size else "no prefix hashes: nothing can be shared")
    )
    reuse = summary.reuse
    share = reuse.hit_share
    reuse_line = (
        f"Unbounded prefix cache could serve {reuse.hit_tokens:,} of "
        f"{reuse.prompt_tokens:,} prompt tokens"
        + (f" ({_pct(share)})" if share is not None else f" ({UNKNOWN}: no prompt content)")
    )
    parts = [head, curve_markdown(summary), reuse_line, reuse_markdown(summary)]
    note = estimate_note(summary)
    closed = summary.estimate.sessions if summary.estimate is not None else None
    if note is not None:
        parts.append(note)
    if closed is not None:
        parts.append(
            f"Sessions: {closed.closed_early:,} closed early by session_state_budget "
            f"{closed.state_budget:,} (their turns are approximate)."
        )
    return "\n\n".join(parts)


def curve_svg(curve: pl.DataFrame, title: str = "Shared-prefix ratio by window") -> bytes:
    """The sharing curve (count and token-weighted, all and prompt ≥ W), deterministic SVG."""
    with drawing(7, 4) as fig:
        ax = fig.subplots()
        x = curve["window_tokens"].to_list()
        series = [
            ("share", "requests"),
            ("token_share", "prompt-token weighted"),
            ("share_eligible", "requests, prompt ≥ W"),
            ("token_share_eligible", "token weighted, prompt ≥ W"),
        ]
        for i, (column, label) in enumerate(series):
            y = [v if v is not None else float("nan") for v in curve[column].to_list()]
            ax.plot(
                x,
                y,
                linestyle=LINESTYLES[i],
                marker=MARKERS[i],
                markersize=3,
                color=COLORS[i],
                label=label,
            )
        if x:
            ax.set_xscale("log", base=2)
        else:
            ax.text(0.5, 0.5, "no prompt content: sharing unknown", ha="center", va="center")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("window W (tokens, log2)")
        ax.set_ylabel("share sharing their first W tokens")
        ax.set_title(title)
        if x:
            ax.legend(fontsize=SMALL_FONT)
        return svg_bytes(fig)
