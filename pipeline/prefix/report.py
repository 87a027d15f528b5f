"""The prefix-sharing analysis end to end: compute, then present (JSON summary, markdown, SVG)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline.prefix.compute import (
    CURVE_SCHEMA,
    at_block_size,
    classify_curve,
    reuse_per_request,
    reuse_summary,
    sharing_curve,
)
from pipeline.prefix.config import PrefixConfig
from pipeline.sessions import infer_sessions

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PrefixAnalysis:
    """Everything the prefix stage produces: the JSON summary and the frames behind it."""

    summary: dict[str, Any]
    curve: pl.DataFrame
    sessions: pl.DataFrame
    reuse: pl.DataFrame


def session_stats(sessions: pl.DataFrame, min_blocks: int) -> dict[str, Any]:
    """Sessions, turns per session (p50 / p99 / max) and whether the ids were inferred."""
    if sessions.height == 0:
        return {
            "requests": 0,
            "sessions": 0,
            "inferred": False,
            "logged_requests": 0,
            "inferred_requests": 0,
            "turns_p50": None,
            "turns_p99": None,
            "turns_max": None,
            "multi_turn_sessions": 0,
            "requests_in_multi_turn_sessions_share": None,
            "min_match_blocks": min_blocks,
        }
    per_session = sessions.group_by("session_id").agg(pl.len().alias("turns"))
    turns = per_session["turns"]
    inferred_requests = int(sessions["session_inferred"].sum())
    multi = per_session.filter(pl.col("turns") > 1)
    return {
        "requests": sessions.height,
        "sessions": per_session.height,
        "inferred": inferred_requests > 0,
        "logged_requests": sessions.height - inferred_requests,
        "inferred_requests": inferred_requests,
        "turns_p50": float(turns.quantile(0.5, interpolation="nearest") or 0),
        "turns_p99": float(turns.quantile(0.99, interpolation="nearest") or 0),
        "turns_max": int(turns.max() or 0),  # type: ignore[arg-type]
        "multi_turn_sessions": multi.height,
        "requests_in_multi_turn_sessions_share": int(multi["turns"].sum()) / sessions.height,
        "min_match_blocks": min_blocks,
    }


def analyse(requests: pl.DataFrame, config: PrefixConfig) -> PrefixAnalysis:
    """Curve, classification, reuse potential and sessions of a canonical table sorted by arrival.

    Sessions are inferred at the table's own block size; the curve and reuse at
    ``config.block_size`` when set (a multiple of the table's).
    """
    sessions = infer_sessions(requests, min_blocks=config.min_session_match_blocks)
    table, block_size = at_block_size(requests, config.block_size)
    known = table.filter(pl.col("hashes_known").fill_null(False))
    # Count-only traces: no block structure, so no curve (and nothing can hit).
    curve = sharing_curve(table, block_size) if known.height else pl.DataFrame(schema=CURVE_SCHEMA)
    median_prompt = known["prompt_tokens"].median() if known.height else None
    classification = classify_curve(
        curve,
        float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
        config,
    )
    reuse = reuse_per_request(table, block_size, config.reuse_age_buckets_s)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "block_size": block_size if known.height else None,
        "requests": requests.height,
        "requests_hashes_known": known.height,
        "requests_hashes_unknown": requests.height - known.height,
        "median_prompt_tokens": float(median_prompt) if median_prompt is not None else None,  # type: ignore[arg-type]
        "curve": curve.to_dicts(),
        "classification": classification,
        "reuse": reuse_summary(reuse, config.reuse_age_buckets_s),
        "sessions": session_stats(sessions, config.min_session_match_blocks),
        "config": {
            "min_session_match_blocks": config.min_session_match_blocks,
            "reuse_age_buckets_s": list(config.reuse_age_buckets_s),
        },
    }
    return PrefixAnalysis(summary=summary, curve=curve, sessions=sessions, reuse=reuse)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f} %"


def curve_markdown(summary: dict[str, Any]) -> str:
    """The sharing curve as a markdown table."""
    lines = [
        "| window (tokens) | share | share (prompt ≥ W) | token-weighted | token-weighted (prompt ≥ W) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in summary["curve"]:
        lines.append(
            f"| {row['window_tokens']:,} | {_pct(row['share'])} | {_pct(row['share_eligible'])} "
            f"| {_pct(row['token_share'])} | {_pct(row['token_share_eligible'])} |"
        )
    return "\n".join(lines)


def reuse_markdown(summary: dict[str, Any]) -> str:
    """Reuse potential by cache retention, cross-tenant part and sessions as markdown."""
    reuse = summary["reuse"]
    lines = [
        "| cache keeps a block after its last use | hit tokens | share of prompt tokens |",
        "|---|---:|---:|",
    ]
    for entry in reuse["by_retention"]:
        label = "forever" if entry["max_age_s"] is None else f"{entry['max_age_s']:g} s"
        lines.append(f"| {label} | {entry['hit_tokens']:,} | {_pct(entry['hit_share'])} |")
    needed = reuse["retention_needed_s"]
    if needed["p90"] is not None:
        lines += [
            "",
            f"To serve 50 / 90 / 99 % of these hits a cache must keep a prefix "
            f"{needed['p50']:,.0f} / {needed['p90']:,.0f} / {needed['p99']:,.0f} s after its last use.",
        ]
    cross = reuse["cross_tenant"]
    if cross is not None:
        lines += [
            "",
            f"Cross-tenant hits: {_pct(cross['cross_tenant_share_of_hits'])} of hit tokens were "
            "served only because another tenant sent the prefix; per-tenant isolation would "
            f"serve {_pct(cross['isolated_hit_share'])} of prompt tokens.",
        ]
    cls = summary["classification"]
    sess = summary["sessions"]
    kind = "inferred from prefix chains" if sess["inferred"] else "logged"
    lines += [
        "",
        f"Curve shape: **{cls['shape']}** ({cls['reason']}).",
        "",
        f"Sessions ({kind}): {sess['sessions']:,}; turns per session p50 {sess['turns_p50']}, "
        f"p99 {sess['turns_p99']}, max {sess['turns_max']}.",
    ]
    return "\n".join(lines)


def curve_svg(curve: pl.DataFrame, title: str = "Shared-prefix ratio by window") -> bytes:
    """A deterministic SVG of the sharing curve (count and token-weighted, all and prompt ≥ W)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "enginefit", "svg.fonttype": "path"}):
        fig, ax = plt.subplots(figsize=(7, 4))
        x = curve["window_tokens"].to_list()
        series = [
            ("share", "requests", "-", "o"),
            ("token_share", "prompt-token weighted", "-", "s"),
            ("share_eligible", "requests, prompt ≥ W", "--", "o"),
            ("token_share_eligible", "token weighted, prompt ≥ W", "--", "s"),
        ]
        for column, label, style, marker in series:
            y = [v if v is not None else float("nan") for v in curve[column].to_list()]
            ax.plot(x, y, linestyle=style, marker=marker, markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("window W (tokens, log2)")
        ax.set_ylabel("share sharing their first W tokens")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
        plt.close(fig)
    return buffer.getvalue().encode()
