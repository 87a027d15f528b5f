"""Assemble every shape metric into one result, the WorkloadFacts, text tables and checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline.facts import LatencyModel, Percentiles, WorkloadFacts
from pipeline.shape.arrivals import WINDOWS_S, arrival_metrics, window_label
from pipeline.shape.common import PERCENTILE_METHOD_DOC, as_lazy, json_safe
from pipeline.shape.concurrency import ConcurrencyResult, peak_concurrency
from pipeline.shape.config import ShapeConfig
from pipeline.shape.findings import Finding, place_on_axes
from pipeline.shape.lengths import length_metrics
from pipeline.shape.mix import (
    category_metrics,
    feature_metrics,
    provider_cache_metrics,
    session_metrics,
)

SCHEMA_VERSION = 1
# Every model is listed (WorkloadFacts.models reads the list); tenants keep the top 20.
MAX_MODELS_LISTED = 1000
_NAN_PERCENTILES = Percentiles(
    p50=float("nan"), p90=float("nan"), p95=float("nan"), p99=float("nan"), max=float("nan")
)


@dataclass(frozen=True)
class ShapeResult:
    """``metrics`` is the JSON document (``workload_shape.json``); the rest feeds plots/facts."""

    metrics: dict[str, Any]
    findings: tuple[Finding, ...]
    concurrency: ConcurrencyResult

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json_safe(self.metrics)
        return out


def compute_shape(
    requests: pl.LazyFrame | pl.DataFrame, cfg: ShapeConfig | None = None
) -> ShapeResult:
    """Every workload-shape metric of a canonical request table (see docs/shape.md for keys)."""
    cfg = cfg or ShapeConfig()
    frame = as_lazy(requests)
    arrivals = arrival_metrics(frame, cfg.min_quanta_per_window)
    conc = peak_concurrency(frame, cfg.latency_model, cfg.plot_points)
    metrics: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "percentile_method": PERCENTILE_METHOD_DOC,
        "requests": arrivals["requests"],
        "arrivals": arrivals,
        "lengths": length_metrics(frame),
        "concurrency": conc.as_dict(),
        "sessions": session_metrics(frame),
        "tenants": category_metrics(frame, "tenant"),
        "models": category_metrics(frame, "model", top=MAX_MODELS_LISTED),
        "features": feature_metrics(frame),
        "provider_cache": provider_cache_metrics(frame),
        "config": cfg.as_dict(),
    }
    findings = tuple(place_on_axes(metrics, cfg))
    metrics["findings"] = [f.as_dict() for f in findings]
    return ShapeResult(metrics=metrics, findings=findings, concurrency=conc)


def _percentiles(dist: dict[str, Any]) -> Percentiles:
    """Percentiles of a ``distribution`` dict; all NaN when the column was never logged."""
    if not dist["count"]:
        return _NAN_PERCENTILES
    return Percentiles(*(float(dist[k]) for k in ("p50", "p90", "p95", "p99", "max")))


def _nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def facts_from_shape(result: ShapeResult) -> WorkloadFacts:
    """WorkloadFacts from a computed shape (unsupported rate windows are left out).

    ``prompt_tokens`` / ``output_tokens`` are all-NaN Percentiles when the column is not logged;
    ``mean_rate_rps`` is NaN when the span is 0 (JSON writers turn NaN into null).
    """
    m = result.metrics
    arrivals = m["arrivals"]
    peaks = {
        window_label(w): float(arrivals["windows"][window_label(w)]["peak_rate_rps"])
        for w in WINDOWS_S
        if arrivals["windows"][window_label(w)]["supported"]
    }
    prompt = _percentiles(m["lengths"]["prompt_tokens"])
    output = _percentiles(m["lengths"]["output_tokens"])
    tenants = m["tenants"]
    models = sorted(str(r["value"]) for r in m["models"]["top"])
    conc = result.concurrency
    return WorkloadFacts(
        requests=int(m["requests"]),
        span_s=float(arrivals["span_s"]),
        mean_rate_rps=_nan_if_none(arrivals["mean_rate_rps"]),
        peak_rate_rps=peaks,
        prompt_tokens=prompt,
        output_tokens=output,
        peak_concurrency=float(conc.peak),
        peak_concurrency_estimated=conc.estimated,
        latency_model=conc.latency_model,
        tenants=int(tenants["distinct"]) if tenants["logged"] else None,
        models=tuple(models),
    )


def compute_workload_facts(
    requests: pl.LazyFrame | pl.DataFrame, latency_model: LatencyModel
) -> WorkloadFacts:
    """The WorkloadFacts of a canonical request table (``shared_prefix_ratio`` left empty)."""
    cfg = ShapeConfig(latency_model=latency_model)
    return facts_from_shape(compute_shape(requests, cfg))


# ---------------------------------------------------------------------------------- present


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() or abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_tables(shape: dict[str, Any]) -> dict[str, str]:
    """Markdown tables of the key numbers: arrivals, lengths, concurrency, mix, findings."""
    a = shape["arrivals"]
    rows: list[list[Any]] = [
        ["requests", shape["requests"]],
        ["span (s)", a["span_s"]],
        ["mean rate (req/s)", a["mean_rate_rps"]],
    ]
    for label, w in a["windows"].items():
        rows.append(
            [f"peak rate over {label} (req/s)", w["peak_rate_rps"]]
            if w["supported"]
            else [f"peak rate over {label}", f"unsupported: {w['reason']}"]
        )
        if w["supported"]:
            rows.append([f"index of dispersion ({label} counts)", w["index_of_dispersion"]])
    ia = a["inter_arrival"]
    rows.append(
        ["inter-arrival CV", ia["cv"]]
        if ia["supported"]
        else ["inter-arrival CV", f"unsupported: {ia['reason']}"]
    )
    q = a["quantisation"]
    rows.append(["timestamps quantised", f"~{q['quantum_s']:g} s" if q["quantised"] else False])
    arrivals_md = _table(["arrivals", "value"], rows)
    lengths = shape["lengths"]
    len_rows = [
        [name, *[d[k] for k in ("count", "p50", "p90", "p95", "p99", "max", "p99_over_p50")]]
        for name, d in (("prompt", lengths["prompt_tokens"]), ("output", lengths["output_tokens"]))
    ]
    lengths_md = _table(["tokens", "count", "p50", "p90", "p95", "p99", "max", "p99/p50"], len_rows)
    c = shape["concurrency"]
    conc_md = _table(
        ["concurrency", "value"],
        [["peak", c["peak"]], ["mean", c["mean"]], ["at", c["peak_at"]], ["how", c["label"]]],
    )
    s = shape["sessions"]
    mix_rows: list[list[Any]] = [
        ["sessions", s["sessions"] if s["known"] else "not logged"],
        ["tenants", shape["tenants"]["distinct"] if shape["tenants"]["logged"] else "not logged"],
        ["models", shape["models"]["distinct"] if shape["models"]["logged"] else "not logged"],
    ]
    if s["known"]:
        mix_rows += [
            ["turns/session p50", s["turns_per_session"]["p50"]],
            ["turns/session p99", s["turns_per_session"]["p99"]],
            ["inter-turn gap p50 (s)", s["inter_turn_gap_s"]["p50"]],
            ["history growth p50 (tokens)", s["history_growth_tokens"]["p50"]],
        ]
    f = shape["features"]
    for flag in ("structured_output", "tools"):
        mix_rows.append([f"{flag} share (of logged)", f[flag]["share_of_logged"]])
    mix_rows.append(["LoRA adapter share", f["lora_adapter"]["share"]])
    pc = shape["provider_cache"]
    mix_rows.append(["provider-cached share", pc["cached_share"] if pc["logged"] else "not logged"])
    mix_md = _table(["mix", "value"], mix_rows)
    findings_md = _table(
        ["axis", "finding", "estimated", "message"],
        [[x["axis"], x["id"], x["estimated"], x["message"]] for x in shape["findings"]],
    )
    return {
        "arrivals": arrivals_md,
        "lengths": lengths_md,
        "concurrency": conc_md,
        "mix": mix_md,
        "findings": findings_md,
    }


def render_text(shape: dict[str, Any], title: str = "Workload shape") -> str:
    tables = summary_tables(shape)
    parts = [f"# {title}", ""]
    for name in ("arrivals", "lengths", "concurrency", "mix", "findings"):
        parts += [f"## {name}", "", tables[name], ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------- checks


def check_estimates_labelled(shape: dict[str, Any]) -> tuple[bool, str]:
    """Every estimated concurrency figure carries its latency-model parameters and label."""
    c = shape["concurrency"]
    if not c["estimated"]:
        ok = c["durations_estimated"] == 0 and c["latency_model"] is None
        return ok, "concurrency is exact (all durations logged)"
    lm = c.get("latency_model") or {}
    missing = [
        k for k in ("ttft_base_ms", "ttft_per_prompt_token_ms", "tpot_ms", "source") if k not in lm
    ]
    finding_flags = [
        f["estimated"]
        for f in shape["findings"]
        if f["axis"] == "concurrency" and f["id"].startswith("concurrency.")
    ]
    ok = not missing and c["label"].startswith("estimated") and all(finding_flags)
    return ok, (
        "estimated concurrency labelled with latency model "
        + ", ".join(f"{k}={lm.get(k)}" for k in sorted(lm))
        if ok
        else f"estimated concurrency not fully labelled (missing {missing or 'finding flag'})"
    )


def check_unsupported_have_reasons(shape: dict[str, Any]) -> tuple[bool, str]:
    """Every statistic marked unsupported says why, and none of them carries a number."""
    a = shape["arrivals"]
    items = [*a["windows"].values(), a["inter_arrival"]]
    bad = [
        i
        for i in items
        if not i["supported"] and (not i.get("reason") or "peak_rate_rps" in i or "cv" in i)
    ]
    n_unsupported = sum(not i["supported"] for i in items)
    return not bad, f"{n_unsupported} unsupported statistics, all with reasons" if not bad else (
        f"{len(bad)} unsupported statistics lack a reason or still carry numbers"
    )
