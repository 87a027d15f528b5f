"""Deterministic SVG plots of the workload shape (matplotlib Agg; same data → same bytes).

Data preparation (``cdf_points``) is separate from drawing; each ``*_svg`` function returns the
SVG bytes and never touches global matplotlib state (everything runs in an ``rc_context``).
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from pipeline.shape.common import as_lazy, collect

_RC: Any = {
    "svg.hashsalt": "enginefit",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def _svg(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def cdf_points(
    frame: pl.LazyFrame | pl.DataFrame, column: str, max_points: int = 2000
) -> pl.DataFrame:
    """Empirical CDF of a column: ``value`` and ``share`` (fraction of non-null rows ≤ value).

    Exact at every returned point; thinned to about ``max_points`` points by keeping the last
    distinct value in each 1/max_points band of cumulative share (the maximum is always kept).
    """
    counts = collect(
        as_lazy(frame)
        .select(pl.col(column).drop_nulls().alias("value"))
        .group_by("value")
        .agg(pl.len().alias("n"))
        .sort("value")
        .select("value", (pl.col("n").cum_sum() / pl.col("n").sum()).alias("share"))
    )
    if counts.height <= max_points:
        return counts
    return (
        counts.with_columns((pl.col("share") * max_points).floor().alias("band"))
        .group_by("band", maintain_order=True)
        .agg(pl.col("value").last(), pl.col("share").last())
        .select("value", "share")
        .sort("value")
    )


def lengths_cdf_svg(curves: dict[str, pl.DataFrame], title: str = "Token length CDFs") -> bytes:
    """One CDF line per entry of ``curves`` (name → ``cdf_points`` frame), symlog x (0 shown)."""
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, pts in sorted(curves.items()):
            if pts.height == 0:
                continue
            x = np.concatenate([[pts["value"][0]], pts["value"].to_numpy()])
            y = np.concatenate([[0.0], pts["share"].to_numpy()])
            ax.step(x, y, where="post", label=name)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("tokens (log scale; 0 shown linearly)")
        ax.set_ylabel("share of requests ≤ x")
        ax.set_ylim(0, 1.01)
        ax.set_title(title)
        ax.legend(loc="lower right")
        return _svg(fig)


def arrivals_svg(
    series: pl.DataFrame, bucket_s: float, peaks: dict[str, Any], note: str = ""
) -> bytes:
    """Requests per bucket over time with the busiest bucket marked.

    ``series`` has ``bucket_start`` and ``requests``; ``peaks`` maps window label → peak rate
    (or a reason string when unsupported), shown in the legend box.
    """
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        t = series["bucket_start"].dt.replace_time_zone(None).to_numpy()
        n = series["requests"].to_numpy()
        ax.step(t, n, where="post", linewidth=0.8)
        if len(n):
            i = int(np.argmax(n))
            ax.plot([t[i]], [n[i]], "v", color="crimson")
            ax.annotate(
                f"peak {int(n[i]):,} / {bucket_s:g} s",
                (t[i], n[i]),
                textcoords="offset points",
                xytext=(6, -2) if i < 0.75 * len(n) else (-90, -2),
                color="crimson",
            )
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel(f"requests per {bucket_s:g} s")
        lines = [f"peak over {k}: {v}" for k, v in peaks.items()]
        ax.set_title("Arrivals over time" + (f" — {note}" if note else ""))
        ax.text(
            0.01,
            0.97,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
        )
        fig.autofmt_xdate()
        return _svg(fig)


def concurrency_svg(series: pl.DataFrame, peak: int, label: str) -> bytes:
    """Concurrency envelope (per-bucket min..max) over time, peak marked, estimate labelled."""
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        t = series["bucket_start"].dt.replace_time_zone(None).to_numpy()
        hi = series["concurrency_max"].to_numpy()
        lo = series["concurrency_min"].to_numpy()
        ax.fill_between(
            t, lo, hi, step="post", alpha=0.35, linewidth=0, label="min..max per bucket"
        )
        ax.step(t, hi, where="post", linewidth=0.8, label="max per bucket")
        if len(hi):
            i = int(np.argmax(hi))
            ax.plot([t[i]], [hi[i]], "v", color="crimson")
            ax.annotate(
                f"peak {peak:,}",
                (t[i], hi[i]),
                textcoords="offset points",
                xytext=(6, -2) if i < 0.75 * len(hi) else (-50, -2),
                color="crimson",
            )
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("requests in flight")
        ax.set_title(
            "Concurrency over time" + (" (ESTIMATED)" if label.startswith("estimated") else "")
        )
        ax.text(0.01, -0.32, label, transform=ax.transAxes, fontsize=7, va="top")
        ax.set_ylim(bottom=0, top=max(1.0, float(hi.max()) * 1.15) if len(hi) else 1.0)
        ax.legend(loc="lower left", fontsize=7)
        fig.autofmt_xdate()
        return _svg(fig)


def shape_charts(
    frame: pl.LazyFrame | pl.DataFrame,
    shape: dict[str, Any],
    concurrency_series: pl.DataFrame,
    plot_points: int = 2000,
) -> dict[str, bytes]:
    """All shape SVGs by file name: ``lengths_cdf.svg``, ``arrivals.svg``, ``concurrency.svg``."""
    from pipeline.shape.arrivals import arrival_series, plot_bucket_s

    lf = as_lazy(frame)
    curves = {
        name: cdf_points(lf, col, plot_points)
        for name, col in (("prompt", "prompt_tokens"), ("output", "output_tokens"))
    }
    a = shape["arrivals"]
    supported = [w["window_s"] for w in a["windows"].values() if w["supported"]]
    quantum = a["quantisation"]["quantum_s"]
    finest = min(supported) if supported else max(float(quantum or 1.0) * 3, 60.0)
    bucket = plot_bucket_s(a["span_s"], finest, plot_points)
    peaks = {
        k: (f"{w['peak_rate_rps']:,.2f} req/s" if w["supported"] else "unsupported (quantised)")
        for k, w in a["windows"].items()
    }
    note = f"timestamps quantised to ~{quantum:g} s" if quantum else ""
    c = shape["concurrency"]
    return {
        "lengths_cdf.svg": lengths_cdf_svg(curves),
        "arrivals.svg": arrivals_svg(arrival_series(lf, bucket), bucket, peaks, note),
        "concurrency.svg": concurrency_svg(concurrency_series, int(c["peak"]), str(c["label"])),
    }
