"""The selection document's content: every number the template shows, with its unit and
sensible rounding, built from the typed stage results and the decision record (nothing is
recomputed here; figures are the stages' own SVGs).

The template (``templates/engine-selection.html.j2``) only lays this out, so a test can check
the executive summary against the decision record without reading the PDF's layout.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from pipeline.bench.result import CapacityRow, FindingRow
from pipeline.capacity.fit import NOT_COMPARABLE
from pipeline.capacity.present import cache_sentence, capacity_words, transfer_sentence
from pipeline.capacity.result import CandidateCapacity, CapacityResult, ServingModel
from pipeline.costing import Prices
from pipeline.dates import days_from
from pipeline.decision.catalog import Catalog
from pipeline.decision.config import KvCacheSizing
from pipeline.decision.present import (
    RULE_OUTCOME_WORDS,
    payback_cell,
    record_names,
    trigger_sentence,
)
from pipeline.decision.result import Candidate, DecisionRecord, TriggerCheck
from pipeline.ingest.result import IngestSummary
from pipeline.ledger import quarter_key, quarter_of
from pipeline.prefix.result import PrefixSummary
from pipeline.present.text import (
    NOTHING,
    UNKNOWN,
    measurement,
    money,
    number,
    share,
    usd,
)
from pipeline.report.accuracy import PublishedErrors, prediction_accuracy
from pipeline.report.memo import decision_memo, trigger_priority
from pipeline.report.workings import Sources, headline_workings
from pipeline.shape.result import ShapeMetrics
from pipeline.sim.result import ScenarioSummary
from pipeline.sources import cited_sources, split_cite
from pipeline.unknown import Unknown, is_known
from pipeline.whatif.present import changes_text, map_reading
from pipeline.whatif.result import WhatifResult


@dataclass(frozen=True)
class PreviousVersion:
    """The version this one is compared with (same quarter, else the previous quarter)."""

    quarter: str
    version: int
    manifest: dict[str, Any]
    record: DecisionRecord


@dataclass(frozen=True)
class ReportContent:
    workload: str
    quarter: str
    version: int
    title: str
    organisation: str | None
    record: DecisionRecord
    ingest: IngestSummary
    shape: ShapeMetrics
    prefix: PrefixSummary | None
    scenarios: list[ScenarioSummary]
    capacity: list[CapacityRow]
    findings: list[FindingRow]
    slo: str
    prices: Prices
    catalog: Catalog
    configuration: dict[str, Any]
    configuration_sha256: str
    code: dict[str, Any]
    inputs: dict[str, str]
    # The report date (pipeline.dates) and where it came from; each benchmark candidate's
    # oldest run date; how old a benchmark may be before it is stale.
    report_date: dt.date
    report_date_source: str
    bench_runs: dict[str, dt.date | None]
    max_age_days: int
    figures: dict[str, bytes] = field(default_factory=dict)
    previous: PreviousVersion | None = None
    # The capacity stage's result (None: it has not run; the costs are then the benchmark's).
    workload_capacity: CapacityResult | None = None
    # The what-if scenarios and decision map (None: `enginefit whatif` has not run).
    whatif: WhatifResult | None = None
    # Earlier published versions' capacity prediction errors, from the ledger.
    prediction_history: list[PublishedErrors] = field(default_factory=list)


def svg_uri(svg: bytes) -> str:
    """An SVG as a data: URI, so the HTML stands alone and the PDF fetches nothing."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


# ------------------------------------------------------------------------------ sections


def build(inputs: ReportContent) -> dict[str, Any]:
    """Everything the template shows, section by section."""
    record = inputs.record
    document: dict[str, Any] = {
        "title": inputs.title,
        "organisation": inputs.organisation,
        "workload": inputs.workload,
        "quarter": inputs.quarter,
        "version": inputs.version,
        "report_date": inputs.report_date.isoformat(),
        "data_range": _data_range(inputs.ingest),
        "memo": decision_memo(record, _layer_name(inputs)),
        "dates": _dates(inputs),
        "summary": executive_summary(inputs),
        "whatif": _whatif(inputs),
        "requirements": _requirements(inputs),
        "shape": _shape(inputs),
        "prefix": _prefix(inputs),
        "bench": _bench(inputs),
        "workload_cost": workload_cost(inputs),
        "accuracy": prediction_accuracy(
            record, inputs.prediction_history, inputs.quarter, inputs.version
        ),
        "catalog": _catalog(inputs.catalog, inputs.report_date),
        "rationale": _rationale(record),
        "triggers": _triggers(inputs),
        "changes": _changes(inputs),
        "workings": _workings(inputs),
        "appendix": _appendix(inputs),
    }
    # The sources list holds exactly what the text cites (rules, triggers, cache sizing …); the
    # appendix's lineage (paths, configuration, hashes) cites nothing.
    document["appendix"]["sources"] = cited_sources(
        {key: value for key, value in document.items() if key != "appendix"}
    )
    return document


def _data_range(summary: IngestSummary) -> str:
    first, last = summary.first_arrival, summary.last_arrival
    if not first or not last:
        return UNKNOWN
    return f"{first[:16].replace('T', ' ')} to {last[:16].replace('T', ' ')} UTC"


#: A candidate's standing in words: "viable" alone reads as an endorsement it is not.
CANDIDATE_STATUS_WORDS = {
    "recommended": "recommended",
    "runner-up": "runner-up",
    "viable": "runs here, not preferred",
    "excluded": "ruled out",
}


def _layer_name(inputs: ReportContent) -> str | None:
    layer = inputs.record.routing.layer
    return inputs.catalog.layers[layer].name if layer else None


def _dates(inputs: ReportContent) -> list[dict[str, str]]:
    """Every date the decision rests on, with its age measured from the report date in words
    (a date after the report date is said so, never a negative age)."""
    date = inputs.report_date
    rows = [{"what": "Report date", "when": f"{date.isoformat()} ({inputs.report_date_source})"}]
    last = inputs.ingest.last_arrival
    traffic_end = dt.date.fromisoformat(last[:10]) if last else None
    if traffic_end is not None:
        rows.append(
            {
                "what": "Traffic",
                "when": f"{_data_range(inputs.ingest)}; its last day "
                f"{days_from(traffic_end, date)} the report date",
            }
        )
    for candidate, run in sorted(inputs.bench_runs.items()):
        rows.append({"what": f"Benchmark {candidate}", "when": _run_age(run, date, inputs)})
    catalog = inputs.catalog.as_of
    rows.append(
        {
            "what": "Engine catalog",
            "when": f"as of {catalog.isoformat()}, {days_from(catalog, date)} the report date"
            + (": it describes the engines as known then" if catalog > date else ""),
        }
    )
    for engine in inputs.catalog.engines.values():
        if engine.status.since is not None:
            rows.append(
                {
                    "what": engine.name,
                    "when": _status_words(engine.status.state, engine.status.since, date),
                }
            )
    span = traffic_quarters(inputs.ingest)
    if span is not None and not quarter_holds_traffic(inputs.quarter, inputs.ingest):
        rows.append(
            {
                "what": "Quarter",
                "when": f"filed under {inputs.quarter} (report.allow_other_quarter); the traffic "
                f"is from {span}",
            }
        )
    return rows


def traffic_quarters(summary: IngestSummary) -> str | None:
    """``2025-Q1`` or ``2025-Q1 to 2025-Q2``: the quarters the traffic spans (None: undated)."""
    if not summary.first_arrival or not summary.last_arrival:
        return None
    first, last = quarter_of(summary.first_arrival), quarter_of(summary.last_arrival)
    return first if first == last else f"{first} to {last}"


def quarter_holds_traffic(quarter: str, summary: IngestSummary) -> bool:
    """Whether any of the traffic falls in ``quarter`` (True when its dates are not known)."""
    if not summary.first_arrival or not summary.last_arrival:
        return True
    first, last = quarter_of(summary.first_arrival), quarter_of(summary.last_arrival)
    return quarter_key(first) <= quarter_key(quarter) <= quarter_key(last)


def _run_age(run: dt.date | None, date: dt.date, inputs: ReportContent) -> str:
    if run is None:
        return "run date not recorded (add run_date to its manifest): age unknown"
    words = f"run {run.isoformat()}, {days_from(run, date)} the report date"
    if (date - run).days > inputs.max_age_days:
        words += f" (older than the {inputs.max_age_days} days a benchmark stays current)"
    last = inputs.ingest.last_arrival
    if last and run > dt.date.fromisoformat(last[:10]):
        words += "; after the traffic's last day"
    return words


def _status_words(state: str, since: dt.date, date: dt.date) -> str:
    """``maintenance since 2025-12-11, 353 days before the report date``."""
    later = " (a later catalog records it)" if since > date else ""
    return f"{state} since {since.isoformat()}, {days_from(since, date)} the report date{later}"


def executive_summary(inputs: ReportContent) -> dict[str, Any]:
    record = inputs.record
    rec = record.recommendation
    names = {c.engine: c.name for c in record.candidates}
    rows = [_candidate_row(c) for c in record.candidates if c.status != "excluded"]
    previous = record.previous
    return {
        "engine": rec.engine_name or "no engine",
        "routing_layer": _layer_name(inputs),
        "routing_reason": record.routing.reason,
        "routing_layer_choice": record.routing.layer_choice,
        # What untrusted tenants need, with its cost (None: no isolation needed or unknown).
        "isolation": rec.isolation.model_dump() if rec.isolation else None,
        "runner_up": names.get(rec.runner_up or "", "none"),
        "confidence": rec.confidence,
        "confidence_reasons": rec.confidence_reasons,
        "state": rec.state,
        "headline": rec.headline,
        "candidates": rows,
        "excluded": [
            {"engine": c.name, "why": c.reasons[0] if c.reasons else ""}
            for c in record.candidates
            if c.status == "excluded"
        ],
        "previous": None
        if previous is None
        else {
            "as_of": previous.as_of or "the previous version",
            "engine": names.get(previous.engine or "", previous.engine or "none"),
            "fired": previous.fired,
        },
    }


def _candidate_row(c: Candidate) -> dict[str, str]:
    """A candidate's headline figures as the executive summary shows them."""
    return {
        "engine": c.name,
        "status": CANDIDATE_STATUS_WORDS[c.status],
        "cost": usd(c.cost_per_1m_output_usd)
        + (" (benchmark's)" if c.cost_basis == "benchmark" else ""),
        "benchmark_cost": usd(c.benchmark_cost_per_1m_output_usd),
        "capacity": number(
            # this workload's whenever the capacity stage carried the benchmark to it
            c.workload_capacity_rps if c.capacity_basis is not None else c.capacity_rps,
            2,
            "req/s",
        ),
        "gpus": number(c.gpus_at_peak),
        "monthly": money(c.monthly_bill()),
        # months, never (it saves nothing), unknown (a cost is missing) or — (no switch)
        "payback": payback_cell(c.payback),
    }


#: Each requirement in words; a key not listed reads as its name with spaces.
REQUIREMENT_LABELS = {
    "deployment": "Where it runs",
    "hardware": "Hardware the fleet has",
    "gpu_types": "GPU types",
    "fixed_sku": "One fixed GPU type for the whole fleet",
    "models": "Models served",
    "model_changes_per_quarter": "Model changes a quarter",
    "features": "Features required",
    "current_engine": "Engine running today",
    "untrusted_tenants": "Tenants who must not share a cache",
    "cost_margin": "Cost gap below which two engines tie",
    "engineer_week_usd": "Cost of an engineer-week",
    "migration_engineer_weeks": "Migration effort (engineer-weeks)",
    "kv_cache": "KV cache per replica",
}


def _requirement_value(key: str, value: Any) -> str:
    """A requirement's value as a reader says it: yes/no, lists joined, money and shares in
    their units, the KV-cache sizing as one sentence."""
    if value in (None, [], {}):
        return f"{UNKNOWN} (not stated)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "cost_margin":
        return share(float(value), 0)
    if key == "engineer_week_usd":
        return money(float(value))
    if key == "kv_cache" and isinstance(value, dict):
        return (
            f"{measurement(value['model_params_billion'])} B parameters at "
            f"{measurement(value['weight_bytes'])} bytes each, {value['layers']} layers, "
            f"{value['kv_heads']} KV heads of {value['head_dim']}, on "
            f"{value['gpus_per_replica']} × {measurement(value['gpu_memory_gib'])} GiB GPU(s) at "
            f"{share(value['memory_utilization'], 0)} use: "
            f"{number(KvCacheSizing.model_validate(value).tokens_per_replica())} tokens"
        )
    if isinstance(value, dict):
        return ", ".join(f"{k}: {measurement(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(measurement(v) for v in value)
    return measurement(value)


def _requirements(inputs: ReportContent) -> dict[str, Any]:
    req = inputs.record.requirements
    rows = [
        {
            "key": REQUIREMENT_LABELS.get(key, key.replace("_", " ").capitalize()),
            "value": _requirement_value(key, value),
        }
        for key, value in req.items()
    ]
    price_rows = [
        {"gpu": gpu, "price": money(price, 2) + "/GPU-hour"}
        for gpu, price in inputs.prices.configured_rows()
    ]
    return {"rows": rows, "slo": inputs.slo, "prices": price_rows}


def _shape(inputs: ReportContent) -> dict[str, Any]:
    metrics = inputs.shape
    arrivals = metrics.arrivals
    conc = metrics.concurrency
    lengths = metrics.lengths
    windows = [
        {
            "window": name,
            "peak": "not supported"
            if isinstance(w, Unknown)
            else number(w.peak_rate_rps, 2, "req/s"),
            "dispersion": w.reason if isinstance(w, Unknown) else number(w.index_of_dispersion, 2),
        }
        for name, w in arrivals.windows.items()
    ]
    return {
        "facts": [
            {"label": "Requests", "value": number(metrics.requests)},
            {"label": "Span", "value": number(arrivals.span_s / 3600, 1, "h")},
            {"label": "Mean arrival rate", "value": number(arrivals.mean_rate_rps, 2, "req/s")},
            {
                "label": "Peak concurrency",
                "value": number(conc.peak)
                + (" (estimated)" if conc.estimated else " (exact, logged durations)"),
            },
            {
                "label": "Prompt tokens p50 / p99",
                "value": f"{number(lengths.prompt_tokens.p50)} / {number(lengths.prompt_tokens.p99)}",
            },
            {
                "label": "Output tokens p50 / p99",
                "value": f"{number(lengths.output_tokens.p50)} / {number(lengths.output_tokens.p99)}",
            },
        ],
        "windows": windows,
        "estimate_note": conc.label if conc.estimated else None,
        "findings": [f.message for f in metrics.findings],
        "figures": _figures(inputs, ("arrivals", "lengths", "concurrency")),
    }


NO_CONTENT = (
    "The traces carry request lengths but no prompt content (nor prefix hashes), so how much "
    "prompts share, what a prefix cache would hit and what routing would buy cannot be measured "
    "here: they are unknown, not zero. A trace with prompt token ids or hashed prompt blocks "
    "answers them."
)


def _prefix(inputs: ReportContent) -> dict[str, Any]:
    record = inputs.record
    prefix = inputs.prefix
    ordered = sorted(
        inputs.scenarios, key=lambda s: (s.replicas, s.cache_tokens, s.routing, s.tenant_isolation)
    )
    scenarios = [
        {
            "replicas": s.replicas,
            "routing": s.routing + (" (isolated)" if s.tenant_isolation else ""),
            "cache": number(s.cache_tokens, unit="tokens"),
            "hit": share(s.hit_ratio if is_known(s.hit_ratio) else None),
            "imbalance": number(s.prefill_imbalance, 2),
        }
        for s in ordered
    ]
    routing = record.routing
    content_free = prefix is None or prefix.block_size is None
    return {
        "classification": prefix.classification.reason if prefix else UNKNOWN,
        "shape": prefix.classification.shape if prefix else UNKNOWN,
        "reuse": share(prefix.reuse.hit_share if prefix else None),
        "scenarios": scenarios,
        "routing": {
            "reason": routing.reason or UNKNOWN,
            "layer": routing.layer and inputs.catalog.layers[routing.layer].name,
            "capacity": routing.cache_tokens_source,
            "money": (
                f"about {number(routing.monthly_prompt_tokens_saved)} prompt tokens a month no "
                f"longer prefilled, worth up to {money(routing.monthly_usd_saved)} a month"
                if routing.monthly_usd_saved is not None
                else None
            ),
            "method": routing.method,
        },
        "isolation": record.isolation.reason,
        # Without prompt content there is no curve to draw: say so instead of empty axes.
        "no_content": NO_CONTENT if content_free else None,
        "figures": []
        if content_free
        else _figures(inputs, ("prefix_curve", "hit_ratio", "imbalance")),
    }


PATTERN_WORDS = {"P": "passed", "F": "failed", "?": "not judged"}
#: The bench stage's capacity status in words (pipeline.bench.slo).
CAPACITY_STATUS_WORDS = {
    "bracketed": "between the last load that passed and the first that failed",
    "not_bracketed": "at least this: every load passed, the sweep stopped short of failing",
    "below_range": "below the lowest load: every load failed",
    "not_searched": "not searched (not an open-loop sweep)",
    "unknown": "unknown",
}


def load_points_text(pattern: str | None) -> str:
    """The bench stage's load pattern (``1:? 31.4:P 122.59:F``: offered req/s and verdict) as
    words: "passed at 31.4 req/s; failed at 122.59 req/s; not judged at 1 req/s"."""
    if not pattern:
        return NOTHING
    by_verdict: dict[str, list[str]] = {}
    for point in pattern.split():
        load, _, verdict = point.rpartition(":")
        by_verdict.setdefault(verdict, []).append(load)
    return "; ".join(
        f"{PATTERN_WORDS.get(v, v)} at {', '.join(loads)} req/s" for v, loads in by_verdict.items()
    )


def _chunked_itl_notes(result: CapacityResult | None) -> list[str]:
    """Why a benchmark's ITL p50 line sits near zero, where the capacity stage found so."""
    notes = []
    for c in result.candidates if result else []:
        model = c.serving_model
        if not isinstance(model, ServingModel):
            continue
        chunked = [e.measured.get("itl_p50") for e in model.point_errors]
        reasons = [
            m for m in chunked if isinstance(m, Unknown) and m.reason.startswith(NOT_COMPARABLE)
        ]
        if reasons:
            notes.append(
                f"{c.candidate}: the ITL p50 line near zero is the tool timing gaps between "
                "streamed chunks of several tokens, not one decode step (its TPOT p50 is the "
                "per-token time); the SLO is judged on ITL p99."
            )
    return notes


CHECK_STATUS_WORDS = {"flag": "flagged", "unknown": "unknown"}


def _findings_by_benchmark(findings: list[FindingRow]) -> list[dict[str, Any]]:
    """Per benchmark: the checks that flagged or could not judge (with the finding), and the
    names of those that passed, in one line."""
    grouped: dict[str, dict[str, Any]] = {}
    for f in findings:
        group = grouped.setdefault(f.candidate, {"candidate": f.candidate, "issues": [], "ok": []})
        if f.status == "ok":
            group["ok"].append(f.check.replace("_", " "))
        else:
            group["issues"].append(
                {
                    "check": f.check.replace("_", " "),
                    "status": CHECK_STATUS_WORDS.get(f.status, f.status),
                    "message": f.message,
                }
            )
    return list(grouped.values())


def _bench(inputs: ReportContent) -> dict[str, Any]:
    return {
        "capacity": [
            {
                "candidate": c.candidate,
                "points": load_points_text(c.pattern),
                "capacity": number(c.capacity_rps, 2, "req/s"),
                "status": CAPACITY_STATUS_WORDS.get(c.capacity_status or "unknown", NOTHING),
                "cost": usd(c.cost_per_1m_output_usd),
            }
            for c in inputs.capacity
        ],
        "findings": _findings_by_benchmark(inputs.findings),
        # A cost chart of one bar says nothing the table does not.
        "figures": _figures(
            inputs, ("latency", "cost") if len(inputs.capacity) > 1 else ("latency",)
        ),
        "notes": _chunked_itl_notes(inputs.workload_capacity),
    }


# The statistics the fitted model's error is shown on, per benchmark point.
ERROR_STATS = ("ttft_p95", "itl_p99")  # measured/predicted keys


def workload_cost(inputs: ReportContent) -> dict[str, Any]:
    """Per benchmarked candidate: the serving model fitted on its benchmark in one line, its
    error on each point, how far this workload is from what was measured (a sentence), the
    capacity with its band, the fleet and the workload's prices beside the benchmark's."""
    record = inputs.record
    result = inputs.workload_capacity
    found = {c.candidate: c for c in result.candidates} if result else {}
    rows = []
    for c in record.candidates:
        if not c.benchmarked:
            continue
        capacity = _capacity_for(found, c.benchmark, c.engine)
        model = capacity.serving_model if capacity else None
        band = c.workload_capacity_band_rps
        rows.append(
            {
                "engine": c.name,
                "basis": c.cost_basis or UNKNOWN,
                "note": c.cost_note if c.cost_basis != "workload" else None,
                "model": _model_line(model) if isinstance(model, ServingModel) else None,
                "errors": _errors(model) if isinstance(model, ServingModel) else [],
                "transfer": transfer_sentence(capacity) if capacity else c.transfer,
                "arrivals": capacity.arrivals.description
                if capacity and capacity.arrivals
                else None,
                "cache": cache_sentence(capacity) if capacity else None,
                "binding": capacity_words(capacity)["capacity_binding"] if capacity else None,
                "sensitivity": _sensitivity(capacity),
                "facts": [
                    {
                        "label": "Capacity per replica at the SLO",
                        "workload": number(c.workload_capacity_rps, 2, "req/s")
                        + (f" ({number(band[0], 2)}–{number(band[1], 2)})" if band else ""),
                        "benchmark": number(c.capacity_rps, 2, "req/s"),
                    },
                    {
                        "label": "Replicas at the workload's peak",
                        "workload": number(c.replicas) if c.cost_basis == "workload" else UNKNOWN,
                        "benchmark": NOTHING,
                    },
                    {
                        "label": "Monthly GPU cost at the peak",
                        "workload": money(c.monthly_cost_usd)
                        if c.cost_basis == "workload"
                        else UNKNOWN,
                        "benchmark": money(c.benchmark_monthly_cost_usd),
                    },
                    {
                        "label": "$ per 1M output tokens (all-in)",
                        "workload": usd(c.cost_per_1m_output_usd)
                        if c.cost_basis == "workload"
                        else UNKNOWN,
                        "benchmark": usd(c.benchmark_cost_per_1m_output_usd),
                    },
                    {
                        "label": "$ per 1M output tokens (decode share)",
                        "workload": usd(c.cost_per_1m_output_decode_usd),
                        "benchmark": NOTHING,
                    },
                    {
                        "label": "$ per 1M input tokens (prefill)",
                        "workload": usd(c.cost_per_1m_input_usd),
                        "benchmark": NOTHING,
                    },
                    {
                        "label": "$ per 1M cached input tokens",
                        "workload": usd(c.cost_per_1m_cached_input_usd),
                        "benchmark": NOTHING,
                    },
                    {
                        "label": "$ per 1M output tokens, the sized fleet at the mean rate",
                        "workload": usd(c.fleet_cost_per_1m_output_usd),
                        "benchmark": NOTHING,
                    },
                ],
            }
        )
    return {
        "rows": rows,
        "slo": result.slo.describe() if result else None,
        "method": result.candidates[0].capacity_method if result and result.candidates else None,
    }


def _sensitivity(capacity: CandidateCapacity | None) -> list[dict[str, str]]:
    """How the candidate's capacity moves with one input moved, one row each."""
    if capacity is None:
        return []
    return [
        {
            "moved": v.description,
            "capacity": number(v.capacity_rps, 2, "req/s"),
            "change": NOTHING if isinstance(v.change, Unknown) else f"{v.change:+.0%}",
        }
        for v in capacity.sensitivity
    ]


def _workings(inputs: ReportContent) -> list[dict[str, Any]]:
    """The auditor's appendix: each headline number's formula and sourced inputs."""
    record = inputs.record
    result = inputs.workload_capacity
    found = {c.candidate: c for c in result.candidates} if result else {}
    capacities = {c.engine: _capacity_for(found, c.benchmark, c.engine) for c in record.candidates}
    sources = Sources(
        record.inputs, inputs.configuration_sha256, str(record.catalog.get("sha256") or "")
    )
    return headline_workings(record, capacities, result.mix if result else None, sources)


def _capacity_for(
    found: dict[str, CandidateCapacity], benchmark: str | None, engine: str
) -> CandidateCapacity | None:
    if benchmark in found:
        return found[benchmark]
    same = [c for c in found.values() if c.deployment.engine.lower() == engine.lower()]
    return same[0] if len(same) == 1 else None


def _model_line(model: ServingModel) -> str:
    """The fitted step-time model in one line, in ms."""
    k = model.coefficients
    return (
        f"step = {k.overhead_s * 1e3:.3g} ms + {k.prefill_s_per_token * 1e3:.3g} ms per "
        f"uncached prompt token + {k.decode_s_per_request * 1e3:.3g} ms per decoding request + "
        f"{k.context_s_per_token * 1e6:.3g} µs per context token read; fitted on "
        f"{model.points_used} load points of {model.deployment.describe()} "
        f"(prefill split: {model.prefill_split_basis}; context: {model.context_basis}; "
        f"spread {model.residual_spread:.1%})"
    )


def _errors(model: ServingModel) -> list[dict[str, str]]:
    rows = []
    for e in model.point_errors:
        row = {"point": e.point_id.rsplit("/", 1)[-1], "rate": number(e.rate_rps, 2, "req/s")}
        for key in ERROR_STATS:
            measured = e.measured.get(key)
            predicted = e.predicted.get(key)
            error = e.error.get(key)
            row[key] = (
                f"{number(measured, 1)} vs {number(predicted, 1)} ms"
                + (f" ({error:+.0%})" if isinstance(error, float) else "")
                if measured is not None and not isinstance(measured, Unknown)
                else f"{UNKNOWN} vs {number(predicted, 1)} ms"
            )
        rows.append(row)
    return rows


def _catalog(catalog: Catalog, report_date: dt.date) -> dict[str, Any]:
    return {
        "as_of": catalog.as_of.isoformat(),
        "engines": [
            {
                "name": e.name,
                "bet": e.design_bet,
                "cache": e.prefix_cache.note,
                "hardware": ", ".join(e.hardware_words(t) for t in e.hardware),
                "change": e.change_summary(),
                "status": _status_words(e.status.state, e.status.since, report_date)
                if e.status.since
                else e.status.state,
                "choose_for": e.choose_for,
                "secondary": [f.shown() for f in e.secondary_figures],
            }
            for e in catalog.engines.values()
        ],
        "layers": [
            {
                "name": layer.name,
                "adds": ", ".join(a.replace("_", " ") for a in layer.adds),
                "engines": ", ".join(layer.engines),
            }
            for layer in catalog.layers.values()
        ],
    }


def _rationale(record: DecisionRecord) -> dict[str, Any]:
    return {
        "rules": [
            {
                "title": r.title,
                "status": RULE_OUTCOME_WORDS[r.fired],
                "effect": r.effect,
                "source": r.source,
                "evidence": [f"{k} = {measurement(v)}" for k, v in r.evidence.items()],
            }
            for r in record.rationale
        ],
        "excluded": [
            {"engine": c.name, "reasons": c.reasons}
            for c in record.candidates
            if c.status == "excluded"
        ],
        "flips": [
            {"engine": c.name, "condition": c.flip_condition}
            for c in record.candidates
            if c.flip_condition
        ],
    }


#: Triggers on the configuration's requirements: one row for all of them (each is "this key
#: changed"), the fired ones named.
REQUIREMENT_TRIGGER = "requirements.changed["


def _short(value: Any) -> str:
    """A trigger's value for a table cell: a structured requirement is referred to, not
    dumped (section 2 shows it)."""
    return "as configured" if isinstance(value, dict | list) else measurement(value)


def _triggers(inputs: ReportContent) -> dict[str, Any]:
    record = inputs.record
    name = record_names(record)
    last: dict[str, TriggerCheck] = (
        {c.id: c for c in record.previous.triggers} if record.previous else {}
    )
    watched = sorted(record.triggers, key=trigger_priority)
    requirements = [t for t in watched if t.id.startswith(REQUIREMENT_TRIGGER)]
    rows = [
        {
            "id": t.id,
            "rule": trigger_sentence(t.metric, t.comparator, t.threshold, t.value, name),
            "now": _short(t.value),
            "last": _short(last[t.id].previous_value) if t.id in last else NOTHING,
            "status": t.status.replace("_", " "),
            "why": split_cite(t.why)[1],
            "cite": split_cite(t.why)[0],
        }
        for t in watched
        if not t.id.startswith(REQUIREMENT_TRIGGER)
    ]
    if requirements:
        keys = [t.id.removeprefix(REQUIREMENT_TRIGGER).rstrip("]") for t in requirements]
        fired = [k for k, t in zip(keys, requirements, strict=True) if t.status == "fired"]
        rows.append(
            {
                "id": f"{REQUIREMENT_TRIGGER}…] ({len(keys)})",
                "rule": "Revisit if any requirement of section 2 is set differently next quarter: "
                + ", ".join(keys),
                "now": "as configured",
                "last": NOTHING,
                "status": "fired" if fired else "not fired",
                "why": "a requirement the decision rests on has changed"
                + (f": {', '.join(fired)}" if fired else ""),
                "cite": split_cite(requirements[0].why)[0],
            }
        )
    return {
        "rows": rows,
        "previous": None
        if record.previous is None
        else [
            {
                "id": c.id,
                "rule": trigger_sentence(c.metric, c.comparator, c.threshold, c.value, name),
                "then": _short(c.previous_value),
                "now": _short(c.value),
                "status": c.status.replace("_", " "),
            }
            for c in record.previous.triggers
        ],
    }


def lineage(inputs: dict[str, str], derived: dict[str, str]) -> dict[str, str]:
    """Every file a version was made from, by one key: the input files as recorded, each
    upstream output as ``derived:<path>`` (what the appendix lists and the changes compare)."""
    return {**inputs, **{f"derived:{path}": digest for path, digest in derived.items()}}


# The headline figures of each candidate the changes section compares, with their labels.
CANDIDATE_FIGURES = {
    "cost": "$ per 1M output tokens at the SLO",
    "benchmark_cost": "benchmark's own $ per 1M output tokens",
    "capacity": "capacity per replica",
    "gpus": "GPUs at peak",
    "monthly": "monthly cost",
    "payback": "switch pays back in",
}
# The workload's headline figures (decision record measurements) and their labels.
WORKLOAD_FIGURES = {
    "shape.arrivals.mean_rate_rps": "mean arrival rate (req/s)",
    "shape.arrivals.peak_rate_rps": "peak arrival rate (req/s)",
    "shape.concurrency.peak": "peak concurrency",
    "shape.output_tokens_per_month": "output tokens per month",
    "prefix.shared_prefix_ratio": "shared-prefix ratio",
}


def headline_figures(record: DecisionRecord) -> dict[str, str]:
    """Every headline number of a decision, as shown (so a change below the shown rounding is
    no change): each candidate's figures, the workload's, and what routing is worth."""
    out = {
        f"{label}, {c.name}": row[key]
        for c in record.candidates
        for row in (_candidate_row(c),)
        for key, label in CANDIDATE_FIGURES.items()
    }
    for c in record.candidates:
        out[f"benchmark's own monthly GPU cost, {c.name}"] = money(c.benchmark_monthly_cost_usd)
    for metric, label in WORKLOAD_FIGURES.items():
        out[label] = measurement(record.measurements.get(metric))
    out["monthly value of prefix-aware routing"] = money(record.routing.monthly_usd_saved)
    return out


def configuration_changes(before: Any, now: Any, key: str = "") -> list[dict[str, str]]:
    """Each configuration key whose value differs, as ``{key, before, now}`` (nested sections
    by dotted key, e.g. ``bench.prices.gpu_hour_usd.H100``; a key added or removed shows
    "not set")."""
    if isinstance(before, dict) and isinstance(now, dict):
        return [
            change
            for name in sorted(set(before) | set(now), key=str)
            for change in configuration_changes(
                before.get(name, _NOT_SET), now.get(name, _NOT_SET), f"{key}.{name}".lstrip(".")
            )
        ]
    if before == now:
        return []
    return [{"key": key, "before": _setting(before), "now": _setting(now)}]


_NOT_SET = object()


def _setting(value: Any) -> str:
    if value is _NOT_SET:
        return "not set"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _changes(inputs: ReportContent) -> dict[str, Any] | None:
    previous = inputs.previous
    if previous is None:
        return None
    before = lineage(previous.manifest.get("inputs", {}), previous.manifest.get("derived", {}))
    now = inputs.inputs
    inputs_changed = [
        {
            "path": path,
            "change": "added"
            if path not in before
            else "removed"
            if path not in now
            else "changed",
        }
        for path in sorted(set(before) | set(now))
        if before.get(path) != now.get(path)
    ]
    old, new = previous.record, inputs.record
    figures_before, figures_now = headline_figures(old), headline_figures(new)
    numbers = [
        {"what": what, "before": figures_before.get(what, NOTHING), "now": shown}
        for what, shown in figures_now.items()
        if figures_before.get(what, NOTHING) != shown
    ]
    numbers += [
        {"what": what, "before": shown, "now": NOTHING}
        for what, shown in figures_before.items()
        if what not in figures_now
    ]
    config_changes = configuration_changes(
        previous.manifest.get("configuration", {}), inputs.configuration
    )
    return {
        "against": f"{previous.quarter} v{previous.version}",
        "inputs": inputs_changed,
        "configuration": config_changes,
        "code_changed": previous.manifest.get("code") != inputs.code,
        "numbers": numbers,
        "decision_before": old.recommendation.headline,
        "decision_now": new.recommendation.headline,
        "decision_changed": (old.recommendation.engine, old.recommendation.routing_layer)
        != (new.recommendation.engine, new.recommendation.routing_layer),
    }


def _appendix(inputs: ReportContent) -> dict[str, Any]:
    summary = inputs.ingest
    return {
        "files": [
            {
                "file": f.file,
                "format": f.format,
                "sha256": f.sha256,
                "read": number(f.records_read),
                "ingested": number(f.ingested),
                "quarantined": number(f.quarantined),
                "reasons": ", ".join(
                    f"{k}: {v:,}" for k, v in sorted(f.quarantined_by_reason.items())
                )
                or NOTHING,
            }
            for f in summary.files
        ],
        "inputs": [{"path": p, "sha256": d} for p, d in sorted(inputs.inputs.items())],
        "configuration": yaml.safe_dump(inputs.configuration, sort_keys=False, allow_unicode=True),
        "code": inputs.code,
        "catalog": inputs.record.catalog,
        "decision_inputs": [{"path": p, "sha256": d} for p, d in inputs.record.inputs.items()],
    }


def _whatif(inputs: ReportContent) -> dict[str, Any] | None:
    """The named scenarios as a table and the decision map with the sentence that reads it."""
    found = inputs.whatif
    if found is None:
        return None
    rows = [
        {
            "name": s.name,
            "changes": changes_text(s.changes),
            "engine": s.engine_name or "none",
            "confidence": s.confidence,
            "monthly": money(s.monthly_cost_usd) if s.monthly_cost_usd is not None else "unknown",
            "against": "; ".join(s.against_today) or "the same decision",
        }
        for s in found.scenarios
    ]
    drawn = found.map
    figure = None
    if drawn is not None and "decision_map" in inputs.figures:
        figure = {
            "title": f"The decision map: the winning engine by {drawn.x.axis.replace('_', ' ')} "
            f"and {drawn.y.axis.replace('_', ' ')}",
            "src": svg_uri(inputs.figures["decision_map"]),
            "reading": map_reading(drawn),
        }
    return {"scenarios": rows, "map": figure}


FIGURE_TITLES = {
    "arrivals": "Arrivals over time",
    "lengths": "Prompt and output length distributions (tokens)",
    "concurrency": "Requests in flight over time",
    "prefix_curve": "Shared-prefix ratio by window W (tokens)",
    "hit_ratio": "Prefix-cache hit ratio by cache size per replica",
    "imbalance": "Load imbalance against hit ratio, per routing",
    "latency": "Latency against offered load, with the SLO limits",
    "cost": "Cost per 1M output tokens at the SLO",
}


def _figures(inputs: ReportContent, names: tuple[str, ...]) -> list[dict[str, str]]:
    return [
        {"title": FIGURE_TITLES[n], "src": svg_uri(inputs.figures[n])}
        for n in names
        if n in inputs.figures
    ]
