"""The decision as assets (logic: :mod:`pipeline.decision.stage`).

- ``engine_decision``: the recommended engine, routing layer and runner-up with confidence,
  every candidate's status and reasons, costs and payback, the ordered rationale, written as
  ``decision/decision.json`` (with its JSON Schema and a plain-text rationale);
- ``revisit_triggers``: the record's triggers, and a previous record's evaluated against this
  run (``decision.previous_record``), as ``decision/triggers.parquet``.
"""

from __future__ import annotations

import dagster as dg

from assets.inputs import step_deps
from assets.metadata import CHECK_PRIORITY, check_result, md, path_entries
from assets.resources import EnginefitStore
from pipeline.commands.decision import configured_inputs
from pipeline.decision import checks, stage
from pipeline.decision.present import candidates_table
from pipeline.present.tables import markdown_table
from pipeline.safe_read import read_json


@dg.asset(
    key=stage.STEP.asset,
    deps=step_deps(stage.STEP),
    group_name="decision",
    kinds={"json"},
)
def engine_decision(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Which engine fits this workload, why (the rules of docs/decision-rules.md in order, with their
    evidence), at what total cost, and what would flip the answer."""
    config = store.config()
    layout = config.layout()
    record = stage.run(configured_inputs(config), config.requirements, config.decision)
    paths = stage.write_record(record, layout)
    rec = record.recommendation
    return dg.MaterializeResult(
        metadata={
            "engine": rec.engine_name or "none",
            "routing_layer": rec.routing_layer or "none",
            "runner_up": rec.runner_up or "none",
            "confidence": rec.confidence,
            "state": rec.state,
            "headline": rec.headline,
            "candidates": md(candidates_table(record)),
            **path_entries(paths),
        }
    )


@dg.asset(
    key=stage.TRIGGERS_STEP.asset,
    deps=step_deps(stage.TRIGGERS_STEP),
    group_name="decision",
    kinds={"parquet"},
)
def revisit_triggers(store: EnginefitStore) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """The measurable conditions that reopen the decision, and whether a previous quarter's
    fired on this run's measurements."""
    layout = store.layout()
    record = stage.read_record(layout)
    paths = stage.write_triggers(record, layout)
    fired = record.previous.fired if record.previous is not None else []
    rows = [
        {
            "id": t.id,
            "metric": t.metric,
            "rule": f"{t.comparator} {t.threshold}",
            "today": t.value.value,
        }
        for t in record.triggers
    ]
    return dg.MaterializeResult(
        metadata={
            "triggers": len(record.triggers),
            "previous_fired": ", ".join(fired) if fired else "none (or no previous record)",
            "table": md(markdown_table(rows)),
            **path_entries(paths),
        }
    )


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=engine_decision,
    description="The record validates against its schema.",
)
def decision_record_valid(store: EnginefitStore) -> dg.AssetCheckResult:
    path = store.layout().decision.record
    return check_result(checks.record_valid(read_json(path), str(path)))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=engine_decision,
    description="Every excluded candidate has a reason.",
)
def excluded_candidates_have_reasons(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.excluded_have_reasons(stage.read_record(store.layout())))


@dg.asset_check(
    op_tags=CHECK_PRIORITY,
    asset=revisit_triggers,
    description="Every trigger reads a metric the record measures.",
)
def triggers_measurable(store: EnginefitStore) -> dg.AssetCheckResult:
    return check_result(checks.triggers_measurable(stage.read_record(store.layout())))


ASSETS = [engine_decision, revisit_triggers]
CHECKS = [decision_record_valid, excluded_candidates_have_reasons, triggers_measurable]
