"""The selection document's content: every number the template shows, with its unit and
sensible rounding, built from the typed stage results and the decision record (nothing is
recomputed here; figures are the stages' own SVGs).

The template (``templates/engine-selection.html.j2``) only lays this out, so a test can check
the executive summary against the decision record without reading the PDF's layout.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import yaml

from pipeline.bench.result import CapacityRow, FindingRow
from pipeline.capacity.present import transfer_sentence
from pipeline.capacity.result import CandidateCapacity, CapacityResult, ServingModel
from pipeline.decision.catalog import Catalog
from pipeline.decision.present import (
    RULE_OUTCOME_WORDS,
    payback_cell,
    record_names,
    trigger_sentence,
)
from pipeline.decision.result import DecisionRecord, TriggerCheck
from pipeline.ingest.result import IngestSummary
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
from pipeline.shape.result import ShapeMetrics
from pipeline.sim.result import ScenarioSummary
from pipeline.unknown import Unknown, is_known

# DOMAIN.md "Sources to cite in reports".
SOURCES = (
    "Kwon et al., Efficient Memory Management for LLM Serving with PagedAttention, SOSP 2023",
    "Zheng et al., SGLang: Efficient Execution of Structured Language Model Programs, NeurIPS 2024",
    "vLLM documentation, automatic prefix caching",
    "NVIDIA TensorRT-LLM documentation",
    "Hugging Face text-generation-inference repository",
    "ggml-org llama.cpp server documentation",
    "Schroeder, Wierman, Harchol-Balter, Open Versus Closed: A Cautionary Tale, NSDI 2006",
)


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
    prices: dict[str, Any]
    catalog: Catalog
    configuration: dict[str, Any]
    configuration_sha256: str
    code: dict[str, Any]
    inputs: dict[str, str]
    figures: dict[str, bytes] = field(default_factory=dict)
    previous: PreviousVersion | None = None
    # The capacity stage's result (None: it has not run; the costs are then the benchmark's).
    workload_capacity: CapacityResult | None = None


def svg_uri(svg: bytes) -> str:
    """An SVG as a data: URI, so the HTML stands alone and the PDF fetches nothing."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


# ------------------------------------------------------------------------------ sections


def build(inputs: ReportContent) -> dict[str, Any]:
    """Everything the template shows, section by section."""
    record = inputs.record
    return {
        "title": inputs.title,
        "organisation": inputs.organisation,
        "workload": inputs.workload,
        "quarter": inputs.quarter,
        "version": inputs.version,
        "as_of": record.as_of or UNKNOWN,
        "data_range": _data_range(inputs.ingest),
        "summary": executive_summary(inputs),
        "requirements": _requirements(inputs),
        "shape": _shape(inputs),
        "prefix": _prefix(inputs),
        "bench": _bench(inputs),
        "workload_cost": workload_cost(inputs),
        "catalog": _catalog(inputs.catalog),
        "rationale": _rationale(record),
        "triggers": _triggers(inputs),
        "changes": _changes(inputs),
        "appendix": _appendix(inputs),
    }


def _data_range(summary: IngestSummary) -> str:
    first, last = summary.first_arrival, summary.last_arrival
    if not first or not last:
        return UNKNOWN
    return f"{first[:16].replace('T', ' ')} to {last[:16].replace('T', ' ')} UTC"


def executive_summary(inputs: ReportContent) -> dict[str, Any]:
    record = inputs.record
    rec = record.recommendation
    names = {c.engine: c.name for c in record.candidates}
    rows = [
        {
            "engine": c.name,
            "status": c.status,
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
            "monthly": money(
                c.monthly_total_usd if c.monthly_total_usd is not None else c.monthly_cost_usd
            ),
            # months, never (it saves nothing), unknown (a cost is missing) or — (no switch)
            "payback": payback_cell(c.payback),
        }
        for c in record.candidates
        if c.status != "excluded"
    ]
    watch = sorted(record.triggers, key=_trigger_priority)
    name = record_names(record)
    previous = record.previous
    return {
        "engine": rec.engine_name or "no engine",
        "routing_layer": record.routing.layer and inputs.catalog.layers[record.routing.layer].name,
        "routing_reason": record.routing.reason,
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
        "triggers": [
            {
                "id": t.id,
                "why": _trigger_words(t.why),
                "rule": trigger_sentence(t.metric, t.comparator, t.threshold, t.value, name),
                "now": measurement(t.value),
                "status": t.status,
            }
            for t in watch[:5]
        ],
        "previous": None
        if previous is None
        else {
            "as_of": previous.as_of or "the previous version",
            "engine": names.get(previous.engine or "", previous.engine or "none"),
            "fired": previous.fired,
        },
    }


# The executive summary shows the five triggers a leader most needs: what fired, what would
# flip the answer, then the axes of DOMAIN.md's decision tree.
_TRIGGER_ORDER = (
    "flip",
    "cost.margin",
    "bench.stale",
    "traffic.",
    "prefix.",
    "concurrency.",
    "engine.",
    "fleet.",
    "catalog.",
)


def _trigger_priority(trigger: Any) -> tuple[int, int, str]:
    rank = next((i for i, p in enumerate(_TRIGGER_ORDER) if trigger.id.startswith(p)), 99)
    if trigger.id.endswith(".beyond_search"):
        rank = 98  # the edge of a range searched without a flip: least telling
    return (trigger.status != "fired", rank, trigger.id)


def _trigger_words(why: str) -> str:
    """A trigger's reason without its citation prefix, for the summary table."""
    return why.removeprefix("DOMAIN.md: ")


def _requirements(inputs: ReportContent) -> dict[str, Any]:
    req = inputs.record.requirements
    rows = [
        {
            "key": key,
            "value": f"{UNKNOWN} (not stated)" if value in (None, [], {}) else measurement(value),
        }
        for key, value in req.items()
    ]
    prices = inputs.prices.get("gpu_hour_usd") or {}
    price_rows = [
        {"gpu": gpu, "price": money(float(price), 2) + "/GPU-hour"}
        for gpu, price in sorted(prices.items())
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
        "figures": _figures(inputs, ("prefix_curve", "hit_ratio", "imbalance")),
    }


def _bench(inputs: ReportContent) -> dict[str, Any]:
    return {
        "capacity": [
            {
                "candidate": c.candidate,
                "pattern": c.pattern or "",
                "capacity": number(c.capacity_rps, 2, "req/s"),
                "status": c.capacity_status or "",
                "cost": usd(c.cost_per_1m_output_usd),
                "pool": c.rank_pool or "",
            }
            for c in inputs.capacity
        ],
        "findings": [
            {
                "candidate": f.candidate,
                "check": f.check,
                "status": f.status,
                "message": f.message,
            }
            for f in inputs.findings
        ],
        "figures": _figures(inputs, ("latency", "cost")),
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


def _catalog(catalog: Catalog) -> dict[str, Any]:
    return {
        "as_of": catalog.as_of.isoformat(),
        "engines": [
            {
                "name": e.name,
                "bet": e.design_bet,
                "cache": e.prefix_cache.note,
                "hardware": ", ".join(
                    f"{t}" + ("" if lvl == "full" else f" ({lvl})") for t, lvl in e.hardware.items()
                ),
                "change": e.change.note,
                "status": e.status.state
                + (f" since {e.status.since.isoformat()}" if e.status.since else ""),
                "choose_for": e.choose_for,
                "secondary": [f.claim for f in e.secondary_figures],
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


def _triggers(inputs: ReportContent) -> dict[str, Any]:
    record = inputs.record
    name = record_names(record)
    last: dict[str, TriggerCheck] = (
        {c.id: c for c in record.previous.triggers} if record.previous else {}
    )
    return {
        "rows": [
            {
                "id": t.id,
                "rule": trigger_sentence(t.metric, t.comparator, t.threshold, t.value, name),
                "now": measurement(t.value),
                "last": measurement(last[t.id].previous_value) if t.id in last else NOTHING,
                "status": t.status,
                "why": t.why,
            }
            for t in record.triggers
        ],
        "previous": None
        if record.previous is None
        else [
            {
                "id": c.id,
                "rule": trigger_sentence(c.metric, c.comparator, c.threshold, c.value, name),
                "then": measurement(c.previous_value),
                "now": measurement(c.value),
                "status": c.status,
            }
            for c in record.previous.triggers
        ],
    }


def _changes(inputs: ReportContent) -> dict[str, Any] | None:
    previous = inputs.previous
    if previous is None:
        return None
    before: dict[str, str] = previous.manifest.get("inputs", {})
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
    old_costs = {c.engine: c.cost_per_1m_output_usd for c in old.candidates}
    numbers = [
        {
            "what": f"cost per 1M output tokens, {c.name}",
            "before": usd(old_costs.get(c.engine)),
            "now": usd(c.cost_per_1m_output_usd),
        }
        for c in new.candidates
        if old_costs.get(c.engine) != c.cost_per_1m_output_usd
    ]
    for metric in (
        "shape.concurrency.peak",
        "prefix.shared_prefix_ratio",
        "shape.arrivals.peak_rate_rps",
    ):
        a, b = old.measurements.get(metric), new.measurements.get(metric)
        if a != b:
            numbers.append({"what": metric, "before": measurement(a), "now": measurement(b)})
    config_changed = previous.manifest.get("configuration_sha256") != inputs.configuration_sha256
    return {
        "against": f"{previous.quarter} v{previous.version}",
        "inputs": inputs_changed,
        "configuration_changed": config_changed,
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
        "sources": list(SOURCES),
    }


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
