"""The workload shape for a person: Markdown tables and deterministic SVG figures."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from pipeline.present.figures import COLORS, LINESTYLES, SMALL_FONT, drawing, svg_bytes
from pipeline.present.tables import key_value_table, markdown_table
from pipeline.shape.result import ShapePlotData, ShapeResult
from pipeline.unknown import is_known

# ------------------------------------------------------------------------------------ tables


def _unsupported(reason: str) -> str:
    return f"unsupported: {reason}"


def summary_tables(shape: dict[str, Any]) -> dict[str, str]:
    """Markdown tables of the key numbers: arrivals, lengths, concurrency, mix, findings."""
    a = shape["arrivals"]
    arrivals: list[tuple[str, Any]] = [
        ("requests", shape["requests"]),
        ("span (s)", a["span_s"]),
        ("mean rate (req/s)", a["mean_rate_rps"]),
    ]
    for label, w in a["windows"].items():
        if w["supported"]:
            arrivals.append((f"peak rate over {label} (req/s)", w["peak_rate_rps"]))
            arrivals.append((f"index of dispersion ({label} counts)", w["index_of_dispersion"]))
        else:
            arrivals.append((f"peak rate over {label}", _unsupported(w["reason"])))
    ia = a["inter_arrival"]
    arrivals.append(
        ("inter-arrival CV", ia["cv"] if ia["supported"] else _unsupported(ia["reason"]))
    )
    q = a["quantisation"]
    arrivals.append(("timestamps quantised", f"~{q['quantum_s']:g} s" if q["quantised"] else False))
    lengths = markdown_table(
        [
            {"tokens": name, **{k: d[k] for k in ("count", "p50", "p90", "p95", "p99", "max")}}
            | {"p99/p50": d["p99_over_p50"]}
            for name, d in (
                ("prompt", shape["lengths"]["prompt_tokens"]),
                ("output", shape["lengths"]["output_tokens"]),
            )
        ]
    )
    c = shape["concurrency"]
    concurrency: list[tuple[str, Any]] = [
        ("peak", c["peak"]),
        ("mean", c["mean"]),
        ("at", c["peak_at"]),
        ("how", c["label"]),
    ]
    if c["quantisation"]["affected"]:
        concurrency.append(("quantisation", c["quantisation"]["note"]))
    s = shape["sessions"]
    mix: list[tuple[str, Any]] = [
        ("sessions", s["sessions"] if s["known"] else "not logged"),
        ("tenants", shape["tenants"]["distinct"] if shape["tenants"]["logged"] else "not logged"),
        ("models", shape["models"]["distinct"] if shape["models"]["logged"] else "not logged"),
    ]
    if s["known"]:
        mix += [
            ("turns/session p50", s["turns_per_session"]["p50"]),
            ("turns/session p99", s["turns_per_session"]["p99"]),
            ("inter-turn gap p50 (s)", s["inter_turn_gap_s"]["p50"]),
            ("history growth p50 (tokens)", s["history_growth_tokens"]["p50"]),
        ]
    f = shape["features"]
    for flag in ("structured_output", "tools"):
        mix.append((f"{flag} share (of logged)", f[flag]["share_of_logged"]))
    mix.append(("LoRA adapter share", f["lora_adapter"]["share"]))
    pc = shape["provider_cache"]
    mix.append(("provider-cached share", pc["cached_share"] if pc["logged"] else "not logged"))
    return {
        "arrivals": key_value_table(arrivals, ("arrivals", "value")),
        "lengths": lengths,
        "concurrency": key_value_table(concurrency, ("concurrency", "value")),
        "mix": key_value_table(mix, ("mix", "value")),
        "findings": markdown_table(
            shape["findings"],
            ["axis", "id", "estimated", "message"],
            headers={"id": "finding"},
        ),
    }


def render_text(shape: dict[str, Any], title: str = "Workload shape") -> str:
    tables = summary_tables(shape)
    parts = [f"# {title}", ""]
    for name in ("arrivals", "lengths", "concurrency", "mix", "findings"):
        parts += [f"## {name}", "", tables[name], ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------- figures


def lengths_cdf_svg(curves: dict[str, pl.DataFrame], title: str = "Token length CDFs") -> bytes:
    """One CDF line per entry of ``curves`` (name → value/share frame), symlog x (0 shown)."""
    with drawing(7, 4) as fig:
        ax = fig.subplots()
        for i, (name, pts) in enumerate(sorted(curves.items())):
            if pts.height == 0:
                continue
            x = np.concatenate([[pts["value"][0]], pts["value"].to_numpy()])
            y = np.concatenate([[0.0], pts["share"].to_numpy()])
            ax.step(x, y, where="post", label=name, color=COLORS[i], linestyle=LINESTYLES[i % 4])
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("tokens (log scale; 0 shown linearly)")
        ax.set_ylabel("share of requests ≤ x")
        ax.set_ylim(0, 1.01)
        ax.set_title(title)
        ax.legend(loc="lower right")
        return svg_bytes(fig)


def _mark_peak(ax: Any, t: Any, values: Any, label: Callable[[int], str]) -> None:
    """A marker and a label at the highest value (the label sits left of it near the end)."""
    if not len(values):
        return
    i = int(np.argmax(values))
    ax.plot([t[i]], [values[i]], "v", color=COLORS[1])
    ax.annotate(
        label(int(values[i])),
        (t[i], values[i]),
        textcoords="offset points",
        xytext=(6, -2) if i < 0.75 * len(values) else (-90, -2),
        color=COLORS[1],
    )


def arrivals_svg(
    series: pl.DataFrame, bucket_s: float, peaks: dict[str, Any], note: str = ""
) -> bytes:
    """Requests per bucket over time with the busiest bucket marked.

    ``series`` has ``bucket_start`` and ``requests``; ``peaks`` maps window label → peak rate
    (or a reason string when unsupported), shown in the legend box.
    """
    with drawing(7.5, 3.4) as fig:
        ax = fig.subplots()
        t = series["bucket_start"].dt.replace_time_zone(None).to_numpy()
        n = series["requests"].to_numpy()
        ax.step(t, n, where="post", linewidth=0.8, color=COLORS[0])
        _mark_peak(ax, t, n, lambda top: f"peak {top:,} / {bucket_s:g} s")
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel(f"requests per {bucket_s:g} s")
        ax.set_title("Arrivals over time" + (f" — {note}" if note else ""))
        ax.text(
            0.01,
            0.97,
            "\n".join(f"peak over {k}: {v}" for k, v in peaks.items()),
            transform=ax.transAxes,
            va="top",
            fontsize=SMALL_FONT,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
        )
        fig.autofmt_xdate()
        return svg_bytes(fig)


def concurrency_svg(series: pl.DataFrame, peak: int, label: str) -> bytes:
    """Concurrency envelope (per-bucket min..max) over time, peak marked, estimate labelled."""
    with drawing(7.5, 3.4) as fig:
        ax = fig.subplots()
        t = series["bucket_start"].dt.replace_time_zone(None).to_numpy()
        hi = series["concurrency_max"].to_numpy()
        lo = series["concurrency_min"].to_numpy()
        ax.fill_between(
            t,
            lo,
            hi,
            step="post",
            alpha=0.35,
            linewidth=0,
            color=COLORS[0],
            label="min..max per bucket",
            # A polygon of four vertices per bucket, thousands of them: an image at RASTER_DPI
            # (the max line over it stays vector).
            rasterized=True,
        )
        ax.step(t, hi, where="post", linewidth=0.8, color=COLORS[0], label="max per bucket")
        _mark_peak(ax, t, hi, lambda _: f"peak {peak:,}")
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("requests in flight")
        ax.set_title(
            "Concurrency over time" + (" (ESTIMATED)" if label.startswith("estimated") else "")
        )
        ax.text(
            0.0,
            -0.32,
            textwrap.fill(label, 110),
            transform=ax.transAxes,
            fontsize=SMALL_FONT,
            va="top",
        )
        ax.set_ylim(bottom=0, top=max(1.0, float(hi.max()) * 1.15) if len(hi) else 1.0)
        ax.legend(loc="lower left", fontsize=SMALL_FONT)
        fig.autofmt_xdate()
        return svg_bytes(fig)


def figures(result: ShapeResult, plots: ShapePlotData) -> dict[str, bytes]:
    """Every shape figure by layout name: ``lengths_svg``, ``arrivals_svg``, ``concurrency_svg``."""
    arrivals = result.metrics.arrivals
    quantum = arrivals.quantisation.quantum_s
    peaks = {
        k: (f"{w.peak_rate_rps:,.2f} req/s" if is_known(w) else "unsupported")
        for k, w in arrivals.windows.items()
    }
    c = result.metrics.concurrency
    label = c.label
    if c.quantisation.affected:
        label += f"; {c.quantisation.note}"
    return {
        "lengths_svg": lengths_cdf_svg(plots.length_cdfs),
        "arrivals_svg": arrivals_svg(
            plots.arrival_series,
            plots.arrival_bucket_s,
            peaks,
            f"timestamps quantised to ~{quantum:g} s" if quantum else "",
        ),
        "concurrency_svg": concurrency_svg(result.concurrency_series, c.peak, label),
    }
