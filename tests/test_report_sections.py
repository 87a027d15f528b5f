"""The document's sections as typed models built from hand-made results, the decision record's
typed measurements (read typed, written bare, so records stay byte-identical and an old record
still reads), and a guard that the report does not go back to untyped mappings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import polars as pl
from polars.testing import assert_frame_equal

from perf.workload import canonical_frame, conversations, spec
from pipeline.decision.measures import (
    DECISION,
    GPU_HOUR_USD,
    PEAK_CONCURRENCY,
    SHAPE,
    Measurement,
)
from pipeline.decision.result import DecisionRecord
from pipeline.prefix.analysis import analyse
from pipeline.prefix.config import PrefixConfig
from pipeline.report.sections.content import ReportContent
from pipeline.report.sections.prefix import NO_CONTENT, prefix, shed_note
from pipeline.report.sections.rationale import ExcludedCandidate, Flip, RuleOutcome, rationale
from pipeline.report.sections.summary import CandidateRow, candidate_row
from pipeline.report.sections.triggers import Checked, Watched, triggers
from pipeline.settings import default_mapping

REPORT = Path(__file__).resolve().parents[1] / "pipeline" / "report"
UNTYPED = re.compile(r"\b(?:dict|Dict|Mapping)\[str,\s*Any\]")
#: Where an untyped mapping may stay, and why: jinja renders a mapping (the document's model
#: dumped), so the template boundary takes one.
ALLOWED = {"present.py": 1}


def test_the_report_keeps_no_untyped_mapping() -> None:
    found = {
        str(path.relative_to(REPORT)): len(UNTYPED.findall(path.read_text(encoding="utf-8")))
        for path in sorted(REPORT.rglob("*.py"))
    }
    assert {name: n for name, n in found.items() if n} == ALLOWED


def _candidate(engine: str, status: str, **figures: Any) -> dict[str, Any]:
    return {
        "engine": engine,
        "name": engine.upper(),
        "status": status,
        "reasons": [],
        "benchmarked": True,
        "benchmark": f"{engine}-h100",
        "cost_per_1m_output_usd": None,
        "monthly_cost_usd": None,
        "monthly_change_cost_usd": None,
        "monthly_total_usd": None,
        "switch_cost_usd": None,
        "flip_condition": None,
        **figures,
    }


def _trigger(id: str, metric: str, comparator: str, threshold: Any, value: Any) -> dict[str, Any]:
    return {
        "id": id,
        "metric": metric,
        "comparator": comparator,
        "threshold": threshold,
        "value": value,
        "why": "docs/decision-rules.md#revisit-triggers: it matters",
        "status": "not_fired",
    }


def _record(**fields: Any) -> dict[str, Any]:
    """A version-3 decision record as a file holds it, with only what the tests read filled."""
    return {
        "schema_version": 3,
        "workload": "w",
        "as_of": "2026-11-29",
        "recommendation": {
            "engine": "vllm",
            "engine_name": "VLLM",
            "routing_layer": None,
            "runner_up": None,
            "confidence": "provisional",
            "confidence_reasons": [],
            "state": "decided",
            "headline": "VLLM",
        },
        "candidates": [],
        "rationale": [],
        "routing": {
            "recommended": None,
            "layer": None,
            "alternatives": [],
            "routing": None,
            "replicas": None,
            "cache_tokens_per_replica": None,
            "cache_tokens_source": "not simulated",
            "prompt_tokens_saved_share": None,
            "monthly_prompt_tokens_saved": None,
            "monthly_usd_saved": None,
            "method": "none",
            "reason": "",
        },
        "isolation": {
            "recommended": None,
            "cross_tenant_share_of_hits": None,
            "hit_ratio_shared": None,
            "hit_ratio_isolated": None,
            "reason": "one tenant",
        },
        "triggers": [],
        "measurements": {},
        "previous": None,
        "requirements": {},
        "catalog": {},
        "inputs": {},
        **fields,
    }


def test_measurements_read_typed_by_their_key_and_are_written_bare() -> None:
    raw = {
        "shape.concurrency.peak": 75,
        "shape.concurrency.estimated": True,
        "decision.gpu_hour_usd[vllm]": 3.0,
        "shape.features.required": ["long_context"],
        "decision.payback_months[vllm]": "never",
        "a.later.metric[x]": None,  # a key this version does not know
    }
    record = DecisionRecord.from_json(_record(measurements=raw), "decision.json")
    assert GPU_HOUR_USD.key("vllm") == "decision.gpu_hour_usd[vllm]"
    assert record.measurements[GPU_HOUR_USD.key("vllm")] == Measurement(
        value=3.0, unit="$/GPU-hour", source=DECISION
    )
    assert record.measurements[PEAK_CONCURRENCY.name] == Measurement(
        value=75, unit="requests in flight", source=SHAPE
    )
    assert record.measurements["a.later.metric[x]"] == Measurement(
        value=None, unit="as recorded", source="the decision record"
    )
    assert record.measured("shape.features.required") == ["long_context"]
    assert record.measured("not.measured") is None
    # On disk the flat mapping, each value of its own JSON type (75 stays an int, True a bool).
    written = record.to_json()["measurements"]
    assert json.dumps(written) == json.dumps(raw)


def test_a_trigger_value_is_a_measurement_and_the_record_writes_what_it_read() -> None:
    peak = _trigger("concurrency.high", "shape.concurrency.peak", ">=", 10.0, 75)
    # An older record's requirement trigger watches the key those versions wrote.
    older = _trigger(
        "requirements.changed[hardware]",
        "requirements.changed[hardware]",
        "!=",
        '["nvidia"]',
        '["nvidia"]',
    )
    raw = _record(triggers=[peak, older], measurements={"shape.concurrency.peak": 75})
    record = DecisionRecord.from_json(raw, "decision.json")
    first, second = record.triggers
    assert first.value == Measurement(value=75, unit="requests in flight", source=SHAPE)
    assert first.threshold == 10.0
    assert second.value.unit == "setting" and second.value.value == '["nvidia"]'
    written = record.to_json()
    assert (written["triggers"], written["measurements"]) == (raw["triggers"], raw["measurements"])


def test_the_triggers_section_collapses_the_requirements_and_checks_the_previous_ones() -> None:
    watched = [
        _trigger("concurrency.high", "shape.concurrency.peak", ">=", 10.0, 75),
        _trigger(
            "requirements.changed[hardware]", "requirements.setting[hardware]", "!=", "x", "x"
        ),
        _trigger("requirements.changed[models]", "requirements.setting[models]", "!=", "y", "z"),
    ]
    watched[2]["status"] = "fired"
    check = watched[0] | {"previous_value": 80, "value": 75}
    previous = {
        "workload": "w",
        "as_of": "2026-08-01",
        "engine": "vllm",
        "record_sha256": "0" * 64,
        "triggers": [check],
        "fired": [],
    }
    record = DecisionRecord.from_json(_record(triggers=watched, previous=previous), "d.json")
    section = triggers(record)
    cite, why = "docs/decision-rules.md#revisit-triggers", "it matters"
    peak = "peak concurrency reaches 10 or more"
    assert section.rows == [
        Watched(
            id="concurrency.high",
            rule=section.rows[0].rule,
            now="75",
            last="80",
            status="not fired",
            why=why,
            cite=cite,
        ),
        Watched(
            id="requirements.changed[…] (2)",
            rule="Revisit if any requirement of section 2 is set differently next quarter: "
            "models, hardware",  # the fired one first
            now="as configured",
            last="—",
            status="fired",
            why="a requirement the decision rests on has changed: models",
            cite=cite,
        ),
    ]
    assert peak in section.rows[0].rule
    assert section.previous == [
        Checked(
            id="concurrency.high",
            rule=section.rows[0].rule,
            then="80",
            now="75",
            status="not fired",
        )
    ]


def test_the_rationale_section_words_each_rule_and_names_the_excluded() -> None:
    rule = {
        "rule": "concurrency",
        "title": "Concurrency",
        "source": "docs/decision-rules.md#concurrency",
        "fired": True,
        "evidence": {"peak": 75, "estimated": True, "share": 0.571274},
        "effect": "Ollama is out.",
    }
    candidates = [
        _candidate("vllm", "recommended", flip_condition="SGLang if the price halves"),
        _candidate("ollama", "excluded", reasons=["concurrency: out at a peak of 10 or more"]),
    ]
    record = DecisionRecord.from_json(_record(rationale=[rule], candidates=candidates), "d.json")
    section = rationale(record)
    assert section.rules == [
        RuleOutcome(
            title="Concurrency",
            status=section.rules[0].status,
            effect="Ollama is out.",
            source="docs/decision-rules.md#concurrency",
            evidence=["peak = 75", "estimated = True", "share = 0.5713"],
        )
    ]
    assert section.excluded == [
        ExcludedCandidate(engine="OLLAMA", reasons=["concurrency: out at a peak of 10 or more"])
    ]
    assert section.flips == [Flip(engine="VLLM", condition="SGLang if the price halves")]


def test_a_candidates_row_shows_the_benchmarks_figures_when_the_workload_has_none() -> None:
    c = _candidate(
        "sglang",
        "runner-up",
        cost_per_1m_output_usd=0.14504,
        cost_basis="benchmark",
        capacity_rps=12.345,
        gpus_at_peak=4,
        monthly_cost_usd=9_000.4,
        benchmark_cost_per_1m_output_usd=0.14504,
    )
    record = DecisionRecord.from_json(_record(candidates=[c]), "d.json")
    assert candidate_row(record.candidates[0]) == CandidateRow(
        engine="SGLANG",
        status="runner-up",
        cost="$0.1450 (benchmark's)",
        benchmark_cost="$0.1450",
        capacity="12.35 req/s",  # the benchmark's: the capacity stage did not carry it
        gpus="4",
        monthly="$9,000",
        payback="—",
    )


def test_the_prefix_section_without_prompt_content_lists_the_scenarios_in_order() -> None:
    scenarios = pl.DataFrame(
        {
            "replicas": [4, 1, 4, 4],
            "cache_tokens": [1_000_000, 4_000_000, 1_000_000, 1_000_000],
            "routing": ["round_robin", "round_robin", "prefix_aware", "prefix_aware"],
            "tenant_isolation": [False, False, True, False],
            "hit_ratio": [0.25, 0.5, 0.125, 0.375],
            "prefill_imbalance": [1.0, 1.0, 1.5, 1.25],
        }
    )
    record = DecisionRecord.from_json(_record(), "d.json")
    inputs = SimpleNamespace(
        record=record,
        prefix=None,
        scenarios=[SimpleNamespace(**row) for row in scenarios.iter_rows(named=True)],
    )
    section = prefix(cast(ReportContent, inputs))
    shown = pl.DataFrame([s.model_dump() for s in section.scenarios])
    # An independent ordering: polars sorts the same keys.
    expected = scenarios.sort("replicas", "cache_tokens", "routing", "tenant_isolation").select(
        "replicas",
        (
            pl.col("routing")
            + pl.when(pl.col("tenant_isolation")).then(pl.lit(" (isolated)")).otherwise(pl.lit(""))
        ).alias("routing"),
        (
            pl.col("cache_tokens").map_elements(lambda n: f"{n:,}", return_dtype=pl.String)
            + " tokens"
        ).alias("cache"),
        (pl.col("hit_ratio") * 100).round(1).cast(pl.String).alias("hit") + "%",
        pl.col("prefill_imbalance")
        .map_elements(lambda x: f"{x:.2f}", return_dtype=pl.String)
        .alias("imbalance"),
    )
    assert_frame_equal(shown, expected)
    assert section.no_content == NO_CONTENT and section.figures == []
    assert (section.classification, section.reuse) == ("unknown", "unknown")


def test_the_prefix_section_says_when_its_figures_are_sampled() -> None:
    """A sampled prefix result puts its sentence under the curve's paragraph (rate and error),
    an exact one none; the template shows it."""
    trace = canonical_frame(conversations(spec(600, "short", seed=3)), 16)
    settings = PrefixConfig.model_validate(default_mapping()["prefix"])
    record = DecisionRecord.from_json(_record(), "d.json")
    notes = []
    for budgets in ({}, {"curve_hash_budget": 500, "reuse_block_budget": 600}):
        found = analyse(trace, settings.replace(**budgets)).summary
        inputs = SimpleNamespace(
            record=record, prefix=found, scenarios=[], figures={}, curve_note=None
        )
        notes.append(prefix(cast(ReportContent, inputs)).estimate_note)
    exact, sampled = notes
    assert exact is None
    assert sampled is not None and sampled.count("spatial sample") == 2 and "±" in sampled
    template = (REPORT.parents[1] / "templates" / "engine-selection.html.j2").read_text()
    assert "{{ doc.prefix.estimate_note }}" in template


def test_the_prefix_section_names_the_fleets_that_shed_requests() -> None:
    """Only the scenarios whose overloaded replica shed requests are named, each with its
    count and share (35,152 of 100,000 = 35.2 %); with none shed there is no note, and the
    template shows it under the scenarios."""
    rows = [
        {
            "replicas": 1,
            "routing": "round-robin",
            "cache_tokens": 1_000_000,
            "shed_requests": 35_152,
        },
        {"replicas": 4, "routing": "round-robin", "cache_tokens": 1_000_000, "shed_requests": 0},
    ]
    scenarios = [cast(Any, SimpleNamespace(requests=100_000, **row)) for row in rows]
    note = shed_note(scenarios)
    assert note is not None
    assert note.endswith(
        "Shed: 1 replica(s), round-robin, 1,000,000 tokens: 35,152 of 100,000 (35.2%)."
    )
    assert "4 replica(s)" not in note
    assert shed_note(scenarios[1:]) is None
    template = (REPORT.parents[1] / "templates" / "engine-selection.html.j2").read_text()
    assert "{{ doc.prefix.shed_note }}" in template
