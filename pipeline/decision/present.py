"""The decision record for people: the rationale as plain text a reviewer reads top to bottom
(``enginefit explain``), the candidates as a table, and the triggers as a frame."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import polars as pl

from pipeline.decision.result import DecisionRecord
from pipeline.present.tables import markdown_table

WIDTH = 96
_FIRED = {True: "applied", False: "did not apply", None: "unknown"}


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ") or [
        indent
    ]


def value_text(value: Any) -> str:
    """A measurement or threshold as a reader sees it (unknown, never blank)."""
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.4g}"
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def rationale_text(record: DecisionRecord) -> str:
    """The whole record as prose: the answer, why, every candidate, the rules in order with
    their evidence, what routing buys, and the triggers that would reopen it."""
    rec = record.recommendation
    lines = [
        f"Engine decision for workload {record.workload} (as of {record.as_of or 'unknown'})",
        "",
    ]
    lines += _wrap(rec.headline)
    lines.append(f"Confidence: {rec.confidence}; state: {rec.state}.")
    for reason in rec.confidence_reasons:
        lines += _wrap(f"- {reason}")
    lines += ["", "Candidates"]
    for c in record.candidates:
        cost = (
            f", ${c.cost_per_1m_output_usd:.4f} per 1M output tokens"
            if c.cost_per_1m_output_usd is not None
            else ""
        )
        monthly = (
            f", ${c.monthly_total_usd or c.monthly_cost_usd:,.0f}/month"
            if (c.monthly_total_usd or c.monthly_cost_usd) is not None
            else ""
        )
        lines += _wrap(f"- {c.name} [{c.status}]{cost}{monthly}")
        for reason in c.reasons:
            lines += _wrap(reason, "    ")
        if c.flip_condition:
            lines += _wrap(f"flips the answer: {c.flip_condition}", "    ")
    lines += ["", "Rules, in the order they were applied"]
    for i, rule in enumerate(record.rationale, 1):
        lines += _wrap(f"{i}. {rule.title} ({rule.rule}): {_FIRED[rule.fired]}. {rule.effect}")
        lines += _wrap(f"source: {rule.source}", "    ")
        for key, value in rule.evidence.items():
            lines += _wrap(f"{key} = {value_text(value)}", "    ")
    routing = record.routing
    lines += ["", "Prefix-aware routing"]
    lines += _wrap(routing.reason or "not evaluated")
    lines += _wrap(f"cache per replica: {routing.cache_tokens_source}")
    if routing.monthly_usd_saved is not None:
        lines += _wrap(
            f"saves about {routing.monthly_prompt_tokens_saved:,.0f} prompt tokens of prefill and "
            f"${routing.monthly_usd_saved:,.0f} a month ({routing.method})"
        )
    elif routing.method:
        lines += _wrap(f"method: {routing.method}")
    lines += ["", "Tenant isolation"]
    lines += _wrap(record.isolation.reason)
    lines += ["", "Revisit triggers (reopen the decision when one fires)"]
    for t in record.triggers:
        lines += _wrap(
            f"- {t.id}: {t.metric} {t.comparator} {value_text(t.threshold)} (today {value_text(t.value)}; "
            f"{t.status}). {t.why}"
        )
    if record.previous is not None:
        prev = record.previous
        lines += [
            "",
            f"Previous decision ({prev.as_of or 'undated'}: {prev.engine}), its triggers now",
        ]
        for check in prev.triggers:
            lines += _wrap(
                f"- {check.id}: {check.metric} {check.comparator} {value_text(check.threshold)}: was "
                f"{value_text(check.previous_value)}, now {value_text(check.value)} → {check.status}"
            )
    lines += ["", "Inputs (sha256)"]
    lines += [f"- {name}: {digest}" for name, digest in record.inputs.items()]
    lines.append(f"- catalog {record.catalog['source']}: {record.catalog['sha256']}")
    return "\n".join(lines) + "\n"


def triggers_frame(record: DecisionRecord) -> pl.DataFrame:
    """One row per trigger (this record's, then the previous record's evaluated now)."""
    rows = [
        {
            "record": "current",
            "id": t.id,
            "metric": t.metric,
            "comparator": t.comparator,
            "threshold": value_text(t.threshold),
            "previous_value": None,
            "value": value_text(t.value),
            "status": t.status,
            "why": t.why,
        }
        for t in record.triggers
    ]
    if record.previous is not None:
        rows += [
            {
                "record": "previous",
                "id": c.id,
                "metric": c.metric,
                "comparator": c.comparator,
                "threshold": value_text(c.threshold),
                "previous_value": value_text(c.previous_value),
                "value": value_text(c.value),
                "status": c.status,
                "why": c.why,
            }
            for c in record.previous.triggers
        ]
    schema = {
        k: pl.String
        for k in (
            "record",
            "id",
            "metric",
            "comparator",
            "threshold",
            "previous_value",
            "value",
            "status",
            "why",
        )
    }
    return pl.DataFrame(rows, schema=schema)


def candidates_table(record: DecisionRecord) -> str:
    frame = pl.DataFrame(
        [
            {
                "engine": c.name,
                "status": c.status,
                "$/1M out": c.cost_per_1m_output_usd,
                "$/month (GPUs + changes)": c.monthly_total_usd
                if c.monthly_total_usd is not None
                else c.monthly_cost_usd,
                "payback (months)": c.payback_months,
                "why": "; ".join(c.reasons[:2]),
            }
            for c in record.candidates
        ],
        schema={
            "engine": pl.String,
            "status": pl.String,
            "$/1M out": pl.Float64,
            "$/month (GPUs + changes)": pl.Float64,
            "payback (months)": pl.Float64,
            "why": pl.String,
        },
    )
    return markdown_table(frame)
